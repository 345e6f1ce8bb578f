"""Prepared objects: keys, candidates, and the binding resolution picks (Step 5).

A prepared requirement (a kernel wanting a packed form of a weight) is satisfied by the
first eligible candidate, in order:

1. ``resident``: the process's weight manager already holds the object under its key;
2. ``persisted``: a compatible packed payload in the prepared cache;
3. ``derived``: a live derived recipe produces it;
4. ``portable``: the portable source, packed by the runtime at session creation.

Compatibility is equality of the :class:`PreparedKey`: source lineage (payload digests),
device, provider, runtime version, CPU features, packed format, shape, dtype and graph
optimization level. A source without a trusted digest makes the cache entry
unverifiable, so the portable recipe is chosen without reading the source to decide.

A persisted payload is skipped, by default, when the runtime packs the source anyway
(what ``weightstore prepare`` probed and recorded; every onnxruntime from 1.22 to 1.32
does): reading it would add its bytes, and on 1.32 a comparison, to the packing it was
meant to save.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

RESIDENT = "resident"
PERSISTED = "persisted"
DERIVED = "derived"
PORTABLE = "portable"
CANDIDATE_ORDER = (RESIDENT, PERSISTED, DERIVED, PORTABLE)
CHEAPER = "cheaper"  # PreparedOptions.prefer: the candidate cheapest on the runtime
IN_ORDER = "in-order"  # the first eligible candidate, whatever it costs


@dataclass(frozen=True)
class PreparedRequirement:
    """A kernel's request for a prepared form of one logical weight."""

    value: str
    kernel: str  # e.g. "MatMul", "Gemm", "Conv"
    form: tuple[tuple[str, str], ...]  # what the packed object represents, e.g. transB
    device: str
    provider: str
    dtype: int
    dims: tuple[int, ...]
    consumers: tuple[str, ...]  # nodes reading the prepared object
    in_subgraph: bool = False  # read inside an If/Loop/Scan body

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return self.value, self.kernel, self.form

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "kernel": self.kernel, "form": dict(self.form),
                "device": self.device, "provider": self.provider,
                "dtype": _dtype_name(self.dtype), "dims": list(self.dims),
                "consumers": list(self.consumers), "in_subgraph": self.in_subgraph}


def _dtype_name(dtype: int) -> str:
    from ..io.onnx_proto import TensorProto  # only when described

    return TensorProto.DataType.Name(dtype)


@dataclass(frozen=True)
class PreparedKey:
    """Everything a packed payload depends on; equal keys are interchangeable bytes."""

    lineage: tuple[str, ...]  # source payload digests ("algo:hex")
    device: str
    provider: str
    runtime: str  # e.g. "onnxruntime 1.24.1"
    cpu_features: tuple[str, ...]
    packed_format: str  # the packed-format identity the runtime writes
    form: tuple[tuple[str, str], ...]  # kernel and its form: kernel=Gemm, transB=1
    dims: tuple[int, ...]
    dtype: int
    optimization_level: str

    def to_dict(self) -> dict[str, Any]:
        return {"lineage": list(self.lineage), "device": self.device,
                "provider": self.provider, "runtime": self.runtime,
                "cpu_features": list(self.cpu_features), "packed_format": self.packed_format,
                "form": dict(self.form), "dims": list(self.dims), "dtype": self.dtype,
                "optimization_level": self.optimization_level}

    @property
    def digest(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        import hashlib

        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class PreparedBinding:
    """The seed's ResolvedWeightBinding: a logical weight bound to a prepared object.

    ``active`` is the packed payload's source when a persisted (or resident) object was
    selected; None when the portable source is read and packed by the runtime.
    """

    value: str
    key: PreparedKey | None
    selected: str  # one of CANDIDATE_ORDER
    reason: str
    active: Any = None  # closure.WeightSource of the packed payload
    rejected: tuple[tuple[str, str], ...] = ()  # (candidate, why not)

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "selected": self.selected, "reason": self.reason,
                "key": None if self.key is None else self.key.digest,
                "rejected": [list(r) for r in self.rejected]}


class PreparedCache(Protocol):
    """Where persisted packed payloads are looked up (metadata only)."""

    @property
    def packing_reused(self) -> bool | None:
        """Does the runtime use these payloads as they are (True) or pack their sources
        again to check them (False)? None when unknown."""
        ...

    def lookup(self, key: PreparedKey) -> Any | None:
        """The packed payload's WeightSource for ``key``, or None."""
        ...


@dataclass(frozen=True)
class PreparedOptions:
    """How prepared objects are resolved: the cache to consult and the target facts."""

    cache: PreparedCache | None = None
    runtime: str | None = None  # defaults to the installed onnxruntime
    cpu_features: tuple[str, ...] | None = None  # defaults to this machine's
    optimization_level: str = "extended"
    resident: Mapping[str, Any] | None = None  # key digest -> resident object
    records: bool = True  # look up the package's prepared records (``weightstore prepare``)
    prefer: str = CHEAPER  # CHEAPER: skip persisted forms the runtime packs again anyway

    def __post_init__(self) -> None:
        if self.prefer not in (CHEAPER, IN_ORDER):
            from ..errors import ResolutionError

            raise ResolutionError("unknown prepared preference", prefer=self.prefer,
                                  known=f"{CHEAPER}, {IN_ORDER}")
