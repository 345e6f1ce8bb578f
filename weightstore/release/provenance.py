"""``SHA256SUMS`` and ``release.json``: what a release engineer signs and checks.

``release.json`` is an in-toto v1 Statement whose predicate is SLSA provenance v1: the
subjects are the archives (sha256) and every companion file inside them (configs,
tokenizers, licences: ``<archive's top folder>/<path in the package>``, the sha256 of its
bytes, so a file taken out of an archive is checked on its own), the build definition
names the recipe, every source model and external data file by content digest, and each
layout's fingerprint; the run details name weightstore and the versions of the libraries
that shape the bytes. Nothing in it depends on paths, host names, users, time or thread
counts (``SOURCE_DATE_EPOCH`` is an input, not a clock reading), so two runs on the same
inputs give identical bytes.

The predicate is what ``cosign attest-blob --type slsaprovenance1 --predicate`` takes, and
the whole Statement what ``cosign attest-blob --statement`` takes.
"""

from __future__ import annotations

import functools
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..version import __version__
from .archive import ARCHIVE_FORMAT

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:weightstore:release:v1"
BUILDER_ID = "urn:weightstore:cli"
SUMS_NAME = "SHA256SUMS"
PROVENANCE_NAME = "release.json"
LIBRARIES = ("onnx", "protobuf", "numpy", "zstandard", "blake3")


@dataclass(frozen=True)
class ArchiveRecord:
    file_name: str
    layout: str
    sha256: str  # hex
    size: int
    fingerprint: str  # the layout's build fingerprint, "blake3:<hex>"
    # the companion files inside: (path in the package, sha256 hex), by path
    companions: tuple[tuple[str, str], ...] = ()

    @property
    def members(self) -> list[FileRecord]:
        """The companion files as subjects: named ``<top folder>/<path>``."""
        from ..packaging.unpack import SUFFIX

        root = self.file_name.removesuffix(SUFFIX)
        return [FileRecord(f"{root}/{path}", sha256) for path, sha256 in self.companions]


@dataclass(frozen=True)
class FileRecord:
    """Another file of the release (a layout's HTML report)."""

    file_name: str
    sha256: str  # hex


def render_sums(archives: Sequence[ArchiveRecord | FileRecord]) -> bytes:
    """GNU coreutils format (``sha256sum -c`` reads it): ``<hex>  <name>`` (two spaces:
    text mode; binary mode's `` *`` is equivalent on POSIX), sorted by name."""
    return "".join(f"{a.sha256}  {a.file_name}\n"
                   for a in sorted(archives, key=lambda a: a.file_name)).encode()


def tool_versions() -> dict[str, str]:
    return dict(_tool_versions())


@functools.cache
def _tool_versions() -> dict[str, str]:
    """Read once per process: the libraries loaded cannot change under it, and the metadata
    scan costs ~30 ms and needs the installation to stay readable (a process that dropped
    its privileges after loading them still records the same versions)."""
    from importlib import metadata  # only when a release is written

    out = {"weightstore": __version__, "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _digest_set(key: str) -> dict[str, str]:
    algo, _, hex_digest = key.partition(":")
    return {algo: hex_digest}


def statement(*, package: str, version: str, archives: Sequence[ArchiveRecord],
              summaries: Sequence[Mapping[str, Any]], epoch: int,
              compression: Mapping[str, Any], recipe: tuple[str, str] | None,
              versions: Mapping[str, str],
              reports: Sequence[FileRecord] | None = None,
              archive_format: int = ARCHIVE_FORMAT) -> dict[str, Any]:
    """The Statement (pure). ``recipe``: ``(file name, sha256 hex)`` when released from a
    recipe; a package folder alone does not know its recipe's bytes. ``reports``: the
    layouts' HTML reports when the release writes them (subjects too, and
    ``"report": true`` among the parameters); None leaves both out. ``archive_format``
    (:mod:`.archive`) is recorded where it shapes the archives: when they hold companion
    files (without them, every format gives the same bytes, and release.json stays what it
    was before companions existed); format 1, which had no such record, is written as it
    was."""
    dependencies: list[dict[str, Any]] = []
    if recipe is not None:
        dependencies.append({"name": f"recipe/{recipe[0]}", "digest": {"sha256": recipe[1]}})
    seen: set[str] = set()
    for summary in summaries:
        for m in summary["models"]:
            for name, key in [(f"models/{m['name']}", m["source_digest"]),
                              *((f"models/{m['name']}/{loc}", d)
                                for loc, d in sorted(m["external_sources"].items()))]:
                if name not in seen:
                    seen.add(name)
                    dependencies.append({"name": name, "digest": _digest_set(key)})
    by_layout = sorted(archives, key=lambda a: a.file_name)
    subjects = sorted([*archives, *(reports or ()), *(m for a in archives for m in a.members)],
                      key=lambda a: a.file_name)
    doc: dict[str, Any] = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": a.file_name, "digest": {"sha256": a.sha256}} for a in subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "package": package,
                    "version": version,
                    "recipe": recipe[0] if recipe is not None else None,
                    "layouts": [a.layout for a in by_layout],
                    "source_date_epoch": epoch,
                    "compression": dict(compression),
                },
                "internalParameters": {
                    "fingerprints": {a.layout: a.fingerprint for a in by_layout},
                    "hash": sorted({s["hash"] for s in summaries}),
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": dict(versions)},
                "metadata": {},
                "byproducts": [{"name": a.file_name, "annotations": {"size": a.size}}
                               for a in by_layout],
            },
        },
    }
    if reports is not None:
        doc["predicate"]["buildDefinition"]["externalParameters"]["report"] = True
    if archive_format > 1 and any(a.companions for a in archives):
        doc["predicate"]["buildDefinition"]["internalParameters"]["archive_format"] = (
            archive_format)
    return doc


def render_statement(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
