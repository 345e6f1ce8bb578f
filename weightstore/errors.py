"""One exception hierarchy for the whole project.

Every error carries structured context (file, line, key, byte offset, digest, ...) so that the
command line can print one precise line and tests can assert on fields rather than on prose.
Each class also derives from the matching built-in so callers can catch ``ValueError`` or
``FileNotFoundError`` where that is the natural question.
"""

from __future__ import annotations

from typing import Any

# what every error about a damaged store object tells its reader to do
REPAIR_HINT = "run 'weightstore store verify --repair'"


class WeightstoreError(Exception):
    """Base class: a message plus the context that locates the problem."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = {k: v for k, v in context.items() if v is not None}

    def __str__(self) -> str:
        if not self.context:
            return self.message
        where = ", ".join(f"{k}={v}" for k, v in self.context.items())
        return f"{self.message} ({where})"


class RecipeError(WeightstoreError, ValueError):
    """The recipe file is malformed, invalid, or uses a feature that is not available."""


class ModelError(WeightstoreError, ValueError):
    """A model file is not ONNX, is truncated, or holds something we refuse to process."""


class PathEscapeError(ModelError):
    """A path in a model or recipe resolves outside the folder it must stay in."""


class ExternalDataError(ModelError):
    """External data is missing, unreadable, or its byte range lies outside its file."""


class IntegrityError(WeightstoreError, ValueError):
    """Bytes do not match the digest or size recorded for them."""


class StoreError(WeightstoreError, RuntimeError):
    """The weight store cannot be opened, locked, read or written."""


class PackageError(WeightstoreError, RuntimeError):
    """A package cannot be written, or its output folder holds something else."""


class OutputError(WeightstoreError, OSError):
    """An output path names what a write must not replace: a folder, a FIFO, a device or a
    socket (a new path or a regular file is written by a rename). An ``OSError`` too, as
    the write it refuses would have failed: a cache that only ever skips a write it cannot
    make skips this one the same way."""


class ConversionError(WeightstoreError, ValueError):
    """A model cannot be converted between inline, external-data and FileConstant forms."""


class ScenarioError(WeightstoreError, ValueError):
    """A modification scenario is unknown, malformed, or does not fit the model."""


class AccuracyError(WeightstoreError, ValueError):
    """A scenario's outputs on the recipe's samples miss a bound of its accuracy gate, or
    cannot be compared with the default graph's."""


class ResolutionError(WeightstoreError, ValueError):
    """A model cannot be resolved: a phase's precondition failed, or a live weight has no
    eligible payload. The context names the phase and the scenario."""


class LoadError(WeightstoreError, RuntimeError):
    """A resolved model's payloads cannot be read or handed to the runtime."""


class ReportError(WeightstoreError, RuntimeError):
    """A report cannot be made (its drawing library absent, a target of no known kind)."""


class RegistryError(WeightstoreError, RuntimeError):
    """An OCI registry refused a request or answered something we cannot use."""


class RegistryAuthError(RegistryError, PermissionError):
    """The registry refused our credentials (or wants some and we have none)."""


class RegistryNotFoundError(RegistryError, LookupError):
    """The repository, tag, manifest or blob does not exist in the registry."""


class RegistryUnreachableError(RegistryError, ConnectionError):
    """The registry could not be reached, or kept failing (429/5xx) after every retry."""


class RegistryTLSError(RegistryUnreachableError):
    """TLS with the registry failed: a certificate not trusted or not for its name, a
    client certificate refused or unusable. Never retried."""


class RegistryDigestError(RegistryError, ValueError):
    """Bytes from (or for) the registry do not hash to the digest that names them."""


class SignatureError(WeightstoreError, ValueError):
    """A signature that does not verify, a key that is not trusted or cannot be read."""
