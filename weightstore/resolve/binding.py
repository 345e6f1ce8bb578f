"""Binding prepared requirements to candidates, in the seed's order (metadata only)."""

from __future__ import annotations

import functools
import platform
from typing import TYPE_CHECKING

from ..catalogue.payload import external_entries
from ..catalogue.sites import ambiguous_names, iter_tensor_sites
from ..io.onnx_proto import TensorProto
from .prepared import (
    CHEAPER,
    DERIVED,
    PERSISTED,
    PORTABLE,
    RESIDENT,
    PreparedBinding,
    PreparedKey,
    PreparedOptions,
)

if TYPE_CHECKING:
    from .prepared import PreparedRequirement
    from .state import ResolutionState

PACKED_FORMAT = "onnxruntime-prepacked-v1"
COSTLIER = ("the runtime packs the source even when a persisted form is supplied (probed "
            "by weightstore prepare): the portable source alone is cheaper")


def runtime_version() -> str:
    import sys

    if "onnxruntime" in sys.modules:
        return f"onnxruntime {sys.modules['onnxruntime'].__version__}"
    return _installed_runtime()


@functools.cache
def _installed_runtime() -> str:
    """The installed onnxruntime's version, read from its metadata once per process (a
    resolution asks once per requirement)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"onnxruntime {version('onnxruntime')}"
    except PackageNotFoundError:
        return "onnxruntime (absent)"


@functools.cache
def cpu_features() -> tuple[str, ...]:
    """The instruction-set features packed layouts depend on (x86 SIMD levels, arm's)."""
    wanted = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
              "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve", "i8mm")
    try:
        text = open("/proc/cpuinfo").read()  # noqa: SIM115
    except OSError:
        return (platform.machine(),)
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags |= set(line.partition(":")[2].split())
    return (platform.machine(), *sorted(f for f in wanted if f in flags))


def value_digests(state: ResolutionState) -> dict[str, str]:
    """Value name -> trusted payload digest (recorded checksum, or the package's store
    key of the same range); values without one are absent, and so are names weights of
    several scopes carry (a requirement names its value by name alone: it stays
    portable)."""
    out: dict[str, str] = {}
    sites = list(iter_tensor_sites(state.model))
    ambiguous = ambiguous_names(state.model, sites)
    for site in sites:
        t = site.tensor
        name = site.value_name or t.name
        if t.data_location != TensorProto.EXTERNAL or name in ambiguous:
            continue
        info = external_entries(t, site.where)
        key = (state.source.store_keys or {}).get((info.location, info.offset))
        digest = info.checksum or key
        if digest:
            out[name] = digest
    return out


def prepared_key(req: PreparedRequirement, lineage: tuple[str, ...],
                 opts: PreparedOptions) -> PreparedKey:
    return PreparedKey(
        lineage=lineage, device=req.device, provider=req.provider,
        runtime=opts.runtime or runtime_version(),
        cpu_features=opts.cpu_features if opts.cpu_features is not None else cpu_features(),
        packed_format=PACKED_FORMAT, form=(("kernel", req.kernel), *req.form),
        dims=req.dims, dtype=req.dtype, optimization_level=opts.optimization_level)


def bind_prepared(state: ResolutionState) -> tuple[PreparedBinding, ...]:
    """One binding per requirement: the first eligible candidate, and why the earlier
    ones were not."""
    digests = value_digests(state)
    out = []
    for req in state.requirements:
        reason = f"prepared {req.kernel}{dict(req.form) or ''} of '{req.value}'"
        rejected: list[tuple[str, str]] = []
        digest = digests.get(req.value)
        if digest is None:
            why = "source digest unknown: cache entry unverifiable"
            rejected += [(RESIDENT, why), (PERSISTED, why)]
            key = None
        else:
            key = prepared_key(req, (digest,), state.prepared)
            resident = state.prepared.resident or {}
            if key.digest in resident:
                out.append(PreparedBinding(req.value, key, RESIDENT, reason,
                                           resident[key.digest]))
                continue
            rejected.append((RESIDENT, "not resident"))
            cache = state.prepared.cache
            found = cache.lookup(key) if cache else None
            if found is not None and state.prepared.prefer == CHEAPER and getattr(
                    cache, "packing_reused", None) is False:
                rejected.append((PERSISTED, COSTLIER))
            elif found is not None:
                out.append(PreparedBinding(req.value, key, PERSISTED, reason, found,
                                           tuple(rejected)))
                continue
            else:
                rejected.append((PERSISTED, "no compatible persisted payload"))
        if req.value in state.derivations and digest is None:  # computed at load
            out.append(PreparedBinding(req.value, key, DERIVED, reason, None,
                                       tuple(rejected)))
            continue
        rejected.append((DERIVED, "not a derived weight"))
        out.append(PreparedBinding(req.value, key, PORTABLE, reason, None, tuple(rejected)))
    main = [b for b, r in zip(out, state.requirements, strict=True) if not r.in_subgraph]
    if any(b.selected == PERSISTED for b in out) and not all(
            b.selected == PERSISTED for b in main):
        # one prepared companion graph holds the main graph's packed objects (onnxruntime
        # packs subgraph weights at session creation): all of them or none
        out = [b if b.selected != PERSISTED else PreparedBinding(
            b.value, b.key, PORTABLE, b.reason, None,
            (*b.rejected, (PERSISTED, "the prepared companion lacks other requirements")))
            for b in out]
    return tuple(out)
