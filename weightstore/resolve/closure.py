"""Payload closure: from the final graph and the selected recipes to the manifest.

Liveness is the transformed graph's (cleanup already removed dead nodes and weights in
every graph and function). Every live tensor whose payload the metadata model omits gets
exactly one source:

* external data it names itself (location, offset, length, checksum as written);
* a derived-weight recipe, whose sources are closed over in turn (the recipe is computed
  at load time; its sources are read once);
* the base model's own payload of that value (inline bytes located by the catalogue).

A prepared binding (see :mod:`.prepared`) makes its packed payload active and turns the
portable payload into a dormant fallback. Only then are the files holding active entries
looked at (:mod:`.files`: existence and size, never their bytes): a missing file nothing
live uses is irrelevant, a missing file something live uses fails naming the scenario,
the initializer and the location.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ..catalogue.payload import describe, expected_nbytes, external_entries
from ..catalogue.reader import Catalogue
from ..catalogue.sites import TensorSite, ambiguous_names, iter_tensor_sites
from ..convert.encoding import has_payload
from ..errors import ResolutionError, ScenarioError
from ..io.onnx_proto import ModelProto, TensorProto
from ..passes.analysis import defined_names, node_subgraphs, output_names
from ..passes.graphpath import Container
from ..scenarios.resolve import live_payloads
from .manifest import ACTIVE, DORMANT, Derivation, ManifestEntry, PayloadSource
from .prepared import PreparedBinding
from .source import record_key


@dataclass(frozen=True)
class WeightSource:
    """Where one value's bytes come from, before closure: a file range, or a recipe."""

    source: PayloadSource | None
    dtype: int
    dims: tuple[int, ...]
    where: str


def base_sources(catalogue: Catalogue) -> dict[str, list[WeightSource]]:
    """Value name, and name qualified by its scope (``TensorSite.scoped_name``) -> payload
    sources of the base model's weights (nothing read, no external file opened: ranges
    come from the model's own external_data entries). A name several scopes define has
    several sources, which a lookup by that name alone refuses."""
    out: dict[str, list[WeightSource]] = {}
    for site in iter_tensor_sites(catalogue.model):
        ws = _site_source(site, catalogue)
        if ws is None:
            continue
        for name in dict.fromkeys((site.value_name or site.tensor.name, site.scoped_name)):
            if name:
                out.setdefault(name, []).append(ws)
    return out


def _site_source(site: TensorSite, catalogue: Catalogue | None) -> WeightSource | None:
    t = site.tensor
    dims = tuple(int(d) for d in t.dims)
    if t.data_type == TensorProto.STRING:
        return None
    if t.data_location == TensorProto.EXTERNAL:
        info = external_entries(t, site.where)
        length = info.length if info.length is not None else expected_nbytes(t.data_type,
                                                                             dims)
        return WeightSource(PayloadSource(info.location, info.offset, length or 0,
                                          checksum=info.checksum),
                            t.data_type, dims, site.where)
    if catalogue is None or site.path not in catalogue.payloads:
        return None
    desc = describe(site, catalogue, catalogue.source.parent)
    if desc is None:
        return None
    return WeightSource(PayloadSource("", desc.offset, desc.length, desc.encoding,
                                      spans=desc.spans), t.data_type, dims, site.where)


def consumers(model: ModelProto, names: Collection[str] | None = None,
              ) -> dict[str, list[str]]:
    """Value name -> readable reasons it is live: the nodes that read it (only for
    ``names``, when given). What each subgraph captures is found once, innermost first."""
    order: list[tuple[Container, list[set[str]]]] = []  # graphs, outer first

    def captured(c: Container) -> set[str]:
        per_node: list[set[str]] = []
        order.append((c, per_node))
        for node in c.node:
            read = {name for name in node.input if name}
            for _, g in node_subgraphs(node):
                read |= captured(g)
            per_node.append(read)
        return set(output_names(c)).union(*per_node) - defined_names(c)

    captured(model.graph)
    for f in model.functions:
        captured(f)
    wanted = None if names is None else set(names)
    out: dict[str, list[str]] = {}
    for c, per_node in order:
        for i, (node, read) in enumerate(zip(c.node, per_node, strict=True)):
            found = read if wanted is None else read & wanted
            if not found:
                continue
            label = node.name or (node.output[0] if node.output else f"#{i}")
            for name in sorted(found):
                how = "input of" if name in node.input else "captured by"
                out.setdefault(name, []).append(f"{how} {node.op_type} '{label}'")
        for name in output_names(c):
            if wanted is None or name in wanted:
                out.setdefault(name, []).append("graph output")
    return out


@dataclass
class _Builder:
    """Entries by byte range (tied and duplicate weights share one), in discovery order."""

    store_keys: Mapping[tuple[str, int], str] | None  # None: the model has no record
    model: str | None = None  # the model file, named by a refusal
    entries: dict[tuple, dict] = field(default_factory=dict)

    def add(self, ws: WeightSource, value: str, reasons: Sequence[str], *, origin: str,
            status: str = ACTIVE, fallback_for: tuple | None = None) -> tuple:
        src = ws.source
        assert src is not None
        key = (status, *src.range_key)
        if src.file and src.store_key is None:
            store_key = record_key(self.store_keys, src.file, src.offset, src.checksum,
                                   model=self.model, initializer=value)
            if store_key is not None:
                src = PayloadSource(src.file, src.offset, src.length, src.encoding,
                                    src.checksum or store_key, store_key, src.spans)
        entry = self.entries.setdefault(key, {
            "source": src, "values": [], "reasons": [], "origin": origin,
            "dtype": ws.dtype, "dims": ws.dims, "fallback_for": fallback_for, "types": []})
        if value not in entry["values"]:
            entry["values"].append(value)
            entry["types"].append((ws.dtype, tuple(ws.dims)))
        for r in reasons:
            if r not in entry["reasons"]:
                entry["reasons"].append(r)
        return key

    def freeze(self) -> tuple[ManifestEntry, ...]:
        ids = {}
        for status in (ACTIVE, DORMANT):
            for n, key in enumerate(k for k in self.entries if k[0] == status):
                ids[key] = f"{'a' if status == ACTIVE else 'd'}{n:05d}"
        out = []
        for key, e in self.entries.items():
            out.append(ManifestEntry(
                ids[key], key[0], e["origin"], e["source"], tuple(e["values"]),
                tuple(e["reasons"]), e["dtype"], e["dims"],
                ids.get(e["fallback_for"]) if e["fallback_for"] is not None else None,
                tuple(e["types"])))
        return tuple(sorted(out, key=lambda x: x.id))


def payload_closure(model: ModelProto, catalogue: Callable[[], Catalogue], *,
                    derivations: Mapping, scenario: str | None,
                    store_keys: Mapping[tuple[str, int], str] | None = None,
                    model_file: str | None = None,
                    bindings: Sequence[PreparedBinding] = (), keeps_source: bool = False,
                    runtime_values: Mapping[str, Mapping] | None = None,
                    ) -> tuple[tuple[ManifestEntry, ...], tuple[Derivation, ...]]:
    """Manifest entries and load-time derivations for the live weights of ``model``.

    ``catalogue`` gives the base model's catalogue, asked for only when a live weight's
    bytes must be found among the base model's own payloads (a packaged model's weights
    are external data: its file is then never walked). A bound packed payload is active;
    its portable source is a dormant fallback, or stays active when the runtime reads it
    anyway (``keeps_source``). ``runtime_values`` are
    initializers a prepared companion graph holds that the runtime created (store keys).
    ``store_keys``: the store key of each external range by (location, offset), from the
    record of ``model_file``; with a record, a live external range it does not list and
    whose external data declares no digest is refused (it would load unverified), and
    None (no record) verifies only the digests external data declares.
    """
    base: dict[str, list[WeightSource]] | None = None  # walked only when a weight needs it
    builder = _Builder(store_keys, model_file)
    derived: dict[str, Derivation] = {}
    bound: dict[str, PreparedBinding] = {}
    for b in bindings:
        bound.setdefault(b.value, b)
    extra = [b for b in bindings if b.active is not None and bound[b.value] is not b]

    def portable(name: str, ws: WeightSource | None, reasons: Sequence[str],
                 origin: str, scoped: str | None = None) -> None:
        """``scoped``: the value's name qualified by its scope, under which the base
        model holds its payload (a derivation's sources are main-graph names)."""
        if ws is None or ws.source is None:
            recipe = derivations.get(name) if name not in ambiguous else None
            if recipe is None:
                nonlocal base
                if base is None:
                    base = base_sources(catalogue())
                found = base.get(scoped or name, [])
                if not found:
                    raise ResolutionError("live weight has no eligible payload",
                                          scenario=scenario, initializer=name)
                if len({f.source for f in found}) != 1:
                    raise ResolutionError("a live weight's name is carried by several "
                                          "different base tensors", scenario=scenario,
                                          initializer=name, count=len(found))
                ws = found[0]
            else:
                add_derivation(name, recipe, reasons)
                return
        binding = bound.get(name)
        if binding is not None and binding.active is not None:
            active = builder.add(binding.active, name, [*reasons, binding.reason],
                                 origin="prepared")
            if keeps_source:
                builder.add(ws, name, [*reasons, f"source of {binding.reason}, which the "
                                       "runtime checks against it"], origin=origin)
            else:
                builder.add(ws, name, [*reasons, f"fallback of {binding.reason}"],
                            origin=origin, status=DORMANT, fallback_for=active)
            return
        builder.add(ws, name, reasons, origin=origin)

    def add_derivation(name: str, recipe, reasons: Sequence[str]) -> None:
        if name in derived:
            return
        clash = next((n for n in (name, *recipe.sources) if n in ambiguous), None)
        if clash is not None:  # a record names values by name alone: which one is meant?
            raise ResolutionError("a derived weight or its source is named like weights of "
                                  "other scopes", scenario=scenario, initializer=clash)
        decl = declared.get(name)
        derived[name] = Derivation(name, recipe.operation, tuple(recipe.sources),
                                   tuple(recipe.attributes),
                                   decl[0] if decl else 0, decl[1] if decl else ())
        for s in recipe.sources:
            portable(s, None, [f"source of {recipe.operation} '{name}'"], "derived-source")

    declared: dict[str, tuple[int, tuple[int, ...]]] = {}
    live_sites = []
    sites = list(iter_tensor_sites(model))
    ambiguous = ambiguous_names(model, sites)
    for site in sites:
        t = site.tensor
        name = site.value_key(ambiguous)
        declared[name] = (t.data_type, tuple(int(d) for d in t.dims))
        if has_payload(t) or t.data_type == TensorProto.STRING:
            continue
        if not any(t.dims) and expected_nbytes(t.data_type, list(t.dims)) == 0:
            continue  # a genuinely empty tensor
        live_sites.append((site, name))
    try:
        external = {p.name: p for p in live_payloads(model, scenario, sites=sites,
                                                     ambiguous=ambiguous)}
    except ScenarioError as exc:
        raise ResolutionError(exc.message, phase="closure", **exc.context) from None
    why = consumers(model, {name for _, name in live_sites} | set(external))
    for site, name in live_sites:
        reasons = why.get(name, []) or [f"live {site.role}"]
        if site.tensor.data_location == TensorProto.EXTERNAL:
            p = external[name]
            ws = WeightSource(PayloadSource(p.location, p.offset, p.length,
                                            checksum=p.checksum),
                              site.tensor.data_type, declared[name][1], site.where)
            portable(name, ws, reasons, "portable")
        else:
            portable(name, None, reasons, "portable", site.scoped_name)
    for b in extra:  # a second packed form of one weight (Gemm with another transB)
        builder.add(b.active, b.value, [b.reason], origin="prepared")
    for name, v in sorted((runtime_values or {}).items()):
        builder.add(WeightSource(PayloadSource("", 0, int(v["length"]),
                                               checksum=v["store_key"],
                                               store_key=v["store_key"]),
                                 int(v["dtype"]), tuple(v["dims"]), name), name,
                    ["created by the runtime in the prepared companion"], origin="runtime")
    for p in external.values():  # FileConstant nodes
        if p.name not in {n for _, n in live_sites}:
            builder.add(WeightSource(PayloadSource(p.location, p.offset, p.length,
                                                   checksum=p.checksum), p.dtype, p.dims,
                                     p.where),
                        p.name, why.get(p.name, []) or ["FileConstant"], origin="portable")
    return builder.freeze(), tuple(derived[k] for k in derived)
