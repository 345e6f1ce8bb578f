"""Writing packages: catalogued sources -> store -> one folder per layout.

Everything here needs onnx and the catalogue; :mod:`weightstore.build` imports this module
only when some package actually has to be written, so an up-to-date rebuild stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..caches.derived_keys import DerivedKeyCache
from ..caches.payload_keys import PayloadKeyCache, RangeReader, StaleKeyError, samples_agree
from ..catalogue.payload import expected_nbytes
from ..catalogue.schema import Path as TensorPath
from ..catalogue.schema import path_str
from ..convert.placement import Placement
from ..convert.weights import ModelWeights, Weight, declared_checksum
from ..errors import IntegrityError, RecipeError, StoreError
from ..io.digests import digest_bytes, make_key, split_key
from ..io.files import atomic_write_bytes, discard_temp_dir, make_temp_dir, publish_dir
from ..io.models import serialize_model
from ..io.onnx_proto import ModelProto, TensorProto
from ..layout.plan import LayoutPlan, PlannedFile, PlannedPayload, plan_groups, plan_layout
from ..layout.writer import FileRange, write_plan
from ..package.bundle_record import device_path
from ..package.summary import (
    SUMMARY_NAME,
    CompanionEntry,
    ExternalWeightDesc,
    ModelSummary,
    package_summary,
    render,
)
from ..progress import Progress
from ..recipe.schema import Layout, Recipe
from ..store import BytesPayload, FilePayload, PayloadSource, StoredObject, WeightStore

if TYPE_CHECKING:  # scenarios, devices and splits load only for recipes that use them
    from ..scenarios.package import AddedWeight, PackagedScenario

COMMON_GROUP = "common"
DEFAULT_GROUP = "default"
# the bytes of scenario-added weights computed before they are stored together
ADDED_BATCH_BYTES = 64 << 20


@dataclass
class Source:
    """One recipe model, catalogued, with the identity that enters the fingerprint."""

    name: str
    weights: ModelWeights
    identity: dict[str, Any] = field(default_factory=dict)
    scenarios: list[PackagedScenario] = field(default_factory=list)
    unverified: set[TensorPath] = field(default_factory=set)  # keys taken from the cache

    def added_weights(self, layout: Layout) -> list[AddedWeight]:
        """Weights the scenarios add that ``layout`` puts in its weight files."""
        if not self.scenarios:
            return []
        from ..scenarios.package import externalized

        embedded = layout.external_weight == "embedded"
        return [w for sc in self.scenarios for w in sc.added
                if externalized(w, layout.size_threshold, embedded)]

    @property
    def external_files(self) -> list[tuple[str, Path]]:
        """``(location, path)`` of every external data file the source model references."""
        return sorted({(d.location, d.file) for d in self.weights.descriptors.values()
                       if d.location is not None})


def open_sources(models: list[tuple[str, Path]]) -> list[Source]:
    """Catalogue every model (metadata only); closes what it opened on failure.

    Each model file is parked once catalogued: a step that reads payloads opens one
    model at a time (``with source.weights.opened():``), so a recipe of hundreds of
    models needs a handful of file descriptors, not one per model.
    """
    sources: list[Source] = []
    try:
        for name, path in models:
            weights = ModelWeights.open(path, fold=True)
            weights.park()
            sources.append(Source(name, weights))
    except BaseException:
        close_sources(sources)
        raise
    return sources


def close_sources(sources: list[Source]) -> None:
    for s in sources:
        s.weights.close()


class _WeightPayload:
    """A catalogued weight handed to the store (a :class:`PayloadSource`)."""

    def __init__(self, mw: ModelWeights, weight: Weight) -> None:
        self._mw = mw
        self._w = weight
        self.key = weight.key
        self.size = weight.size

    def read(self) -> bytes:
        return self._mw.read(self._w)

    def file_range(self) -> tuple[str, int] | None:
        p = self._w.payload
        return (str(p.file), p.offset) if p.encoding == "raw" else None

    def describe(self) -> str:
        where = self.file_range()
        if where is not None:
            return f"{where[0]} at offset {where[1]}"
        return f"{self._w.site.where} of {self._mw.catalogue.source}"


def fill_store(store: WeightStore, sources: list[Source], layouts: list[Layout], algo: str,
               jobs: int, progress: bool | None, *, trust_cache: bool = True,
               ) -> dict[str, int]:
    """Hash every payload some layout externalizes and put it into the store once.

    Embedded layouts keep every weight inline and need nothing from the store. Keys of
    unchanged sources come from the payload-key cache when they pass its checks
    (:mod:`weightstore.caches.payload_keys`).
    """
    layouts = [layout for layout in layouts if layout.external_weight != "embedded"]
    report = dict.fromkeys(("written_objects", "written_bytes", "reused_objects",
                            "reused_bytes", "padding_bytes"), 0)
    if not layouts:
        return report
    per_model = _selected(sources, layouts)
    if trust_cache:
        _use_cached_keys(store, per_model, algo)
        _use_derived_keys(store, sources, algo)
    total = sum(w.size for s, ws in per_model for w in ws if w.site.path not in s.weights.keys)
    hashed = []
    with Progress("hashing", total, enabled=progress) as bar:  # what no cache gave a key
        for s, ws in per_model:
            with s.weights.opened():  # one model file open at a time
                hashed.append((s, s.weights.hash(ws, algo, jobs, bar.advance)))
    cache = PayloadKeyCache(store.root)
    stored = sum(w.size for _, ws in hashed for w in ws)  # every payload: the bar's steps
    with Progress("storing", stored, enabled=progress) as bar:
        for s, ws in hashed:
            with s.weights.opened():
                _store_model(store, s, ws, layouts, algo, jobs, report)
            bar.advance(sum(w.size for w in ws))
            cache.save(s.identity, algo, {path_str(w.site.path): w.key for w in ws})
            if s.scenarios:
                DerivedKeyCache(store.root).save(
                    s.identity, algo, {i: w.key for i, w in _added_ids(s) if w.key})
    return report


def store_companions(store: WeightStore, companions: Sequence[tuple[CompanionEntry, Path]],
                     report: dict[str, int]) -> dict[str, int]:
    """Put each companion file's bytes (``(entry, source file)``) into the store as one
    object under its digest, as a payload is: once however many packages and versions
    ship it, every object re-hashed against its key before it is indexed (a file changed
    since it was hashed is an :class:`IntegrityError`). Returns ``report`` with what the
    put wrote and reused added."""
    unique = {e.digest: FilePayload(e.digest, e.size, str(file)) for e, file in companions}
    put = store.put(list(unique.values()), kind="separate", jobs=1)
    out = dict(report)
    for k, v in put.to_dict().items():
        out[k] = out.get(k, 0) + v
    return out


@dataclass(frozen=True)
class PackageCompanions:
    """A package's companion files: ``top``, at the package root; ``devices``, each
    device's own (by device name), which replace the top-level one at their path or are
    added, in ``devices/<device>/<path>``."""

    top: Sequence[CompanionEntry] = ()
    devices: Mapping[str, Sequence[CompanionEntry]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.top) or any(self.devices.values())

    def device_set(self, device: str) -> list[CompanionEntry]:
        """The device's complete set, sorted by path, as its runtime folder holds it."""
        merged = {**{c.path: c for c in self.top},
                  **{c.path: c for c in self.devices.get(device, ())}}
        return [merged[p] for p in sorted(merged)]

    def placed(self) -> list[tuple[str, CompanionEntry]]:
        """``(path in the package, entry)`` of every file, the devices' own included."""
        return [(c.path, c) for c in self.top] + [
            (device_path(d, c.path), c) for d, cs in self.devices.items() for c in cs]


def _write_companions(store: WeightStore, folder: Path,
                      companions: Sequence[tuple[str, CompanionEntry]], plan: LayoutPlan,
                      algo: str, jobs: int) -> dict[str, str]:
    """Copy the companion files (``(path in the package, entry)``) from the store into the
    package's temp ``folder`` (each re-hashed against its key); a path a weight file of
    ``plan`` takes (in the package, or at a device's runtime folder's root) is refused.
    Returns each file's ``algo`` digest, taken from the bytes written."""
    from ..package.assembly import assemble, weight_file
    from ..recipe.companions import collision

    # a weight file, and a folder of them (a split separate layout's groups)
    taken = sorted({f.name for f in plan.files} | {f.name.rpartition("/")[0]
                                                    for f in plan.files if "/" in f.name})
    for _, c in companions:
        other = collision(c.path, taken)
        if other is not None:
            raise RecipeError(f"companion path '{c.path}' collides with the weight file "
                              f"'{other}' of this layout", key="files", path=c.path)
    return assemble(store, folder, [weight_file(at, c.size, [(0, c.size, c.digest)])
                                    for at, c in companions], jobs=jobs, file_digest=algo)


def _selected(sources: list[Source], layouts: list[Layout],
              ) -> list[tuple[Source, list[Weight]]]:
    """Each source's weights that some of ``layouts`` externalizes, in structural order."""
    per_model: list[tuple[Source, list[Weight]]] = []
    for s in sources:
        chosen: dict[TensorPath, Weight] = {}
        for layout in layouts:
            for w in s.weights.select(layout.size_threshold, layout.constants):
                chosen.setdefault(w.site.path, w)
        per_model.append((s, [w for site in s.weights.sites if (w := chosen.get(site.path))]))
    return per_model


def plan_store(store: WeightStore, sources: list[Source], layouts: list[Layout], algo: str,
               jobs: int, progress: bool | None,
               companions: Sequence[CompanionEntry] = ()) -> dict[str, int]:
    """What :func:`fill_store` and :func:`store_companions` would write and reuse,
    writing nothing (``build --dry-run``).

    Keys come from the caches where they pass their checks, else from hashing. Weights
    that scenarios derive are not computed: they are counted apart, by size.
    """
    layouts = [layout for layout in layouts if layout.external_weight != "embedded"]
    report = dict.fromkeys(("written_objects", "written_bytes", "reused_objects",
                            "reused_bytes", "derived_objects", "derived_bytes"), 0)
    unique: dict[str, int] = {c.digest: c.size for c in companions}
    if not layouts:
        _count_planned(store, unique, report)
        return report
    per_model = _selected(sources, layouts)
    _use_cached_keys(store, per_model, algo, forget_bad=False)
    total = sum(w.size for s, ws in per_model for w in ws if w.site.path not in s.weights.keys)
    with Progress("hashing", total, enabled=progress) as bar:
        for s, ws in per_model:
            with s.weights.opened():
                for w in s.weights.hash(ws, algo, jobs, bar.advance):
                    unique.setdefault(w.key, w.size)
    _count_planned(store, unique, report)
    for s in sources:
        added = [w for _, w in _added_ids(s)]
        report["derived_objects"] += len(added)
        report["derived_bytes"] += sum(w.nbytes for w in added)
    return report


def _count_planned(store: WeightStore, unique: Mapping[str, int],
                   report: dict[str, int]) -> None:
    """Count each object (key -> size) as written or, when the store holds it, reused."""
    index = store.locate(unique)  # what the store already holds, looked up by key
    for key, size in unique.items():
        kind = "reused" if key in index else "written"
        report[f"{kind}_objects"] += 1
        report[f"{kind}_bytes"] += size


def _added_ids(s: Source) -> list[tuple[str, AddedWeight]]:
    """Each weight the scenarios of ``s`` add, under its id in the derived-key cache."""
    if not s.scenarios:
        return []
    from ..scenarios.package import added_weight_ids

    return [pair for sc in s.scenarios for pair in added_weight_ids(sc)]


def _use_derived_keys(store: WeightStore, sources: list[Source], algo: str) -> None:
    """Keys of derived weights remembered for an unchanged source and scenario, taken
    when the store holds them at the weight's size: those are not computed again."""
    if not any(s.scenarios for s in sources):
        return
    cache = DerivedKeyCache(store.root)
    entries = [(ids, cache.load(s.identity, algo) if ids else {})
               for s in sources for ids in [_added_ids(s)]]
    index = store.locate({key for _, known in entries for key in known.values()})
    for ids, known in entries:
        for weight_id, weight in ids:
            key = known.get(weight_id)
            obj = index.get(key) if key else None
            if obj is not None and obj.size == weight.nbytes:
                weight.key, weight.size = key, obj.size


def _store_model(store: WeightStore, s: Source, ws: list[Weight], layouts: list[Layout],
                 algo: str, jobs: int, report: dict[str, int]) -> None:
    """Put one model's payloads, then the weights its scenarios add, into the store."""
    combined = any(layout.external_weight == "combined" for layout in layouts)
    kind: Literal["combined", "separate"] = "combined" if combined else "separate"
    alignment = max(layout.alignment for layout in layouts)
    payloads: list[PayloadSource] = [_WeightPayload(s.weights, w) for w in ws]
    put = store.put(payloads, kind=kind, combined_name=s.name if combined else None,
                    alignment=alignment, jobs=jobs)
    for k, v in put.to_dict().items():
        report[k] += v
    if not s.scenarios:
        return
    from ..scenarios.package import hash_added

    # every one, the small ones a package keeps inline too: a rebuild then reads them
    # from the store (by the derived-key cache) instead of computing them again (a
    # quantized weight's small scales would otherwise quantize the whole weight again)
    todo = [w for sc in s.scenarios for w in sc.added if not w.key]  # the rest are stored

    def put_batch(batch: list[BytesPayload]) -> None:
        put = store.put(batch, kind=kind, combined_name=s.name if combined else None,
                        alignment=alignment, jobs=1)
        for k, v in put.to_dict().items():
            report[k] += v

    # computed by ``jobs`` threads, in order; stored a batch at a time (bounded memory)
    batch: list[BytesPayload] = []
    held = 0
    for weight, data in hash_added(todo, algo, jobs):
        batch.append(BytesPayload(weight.key, data))
        held += len(data)
        if held >= ADDED_BATCH_BYTES:
            put_batch(batch)
            batch, held = [], 0
    if batch:
        put_batch(batch)


def _use_cached_keys(store: WeightStore, per_model: list[tuple[Source, list[Weight]]],
                     algo: str, *, forget_bad: bool = True) -> None:
    """Take each source's cached keys that pass the cheap checks; one failure drops the
    source's whole entry (it is damaged or tampered with) and leaves every key to hashing.
    """
    cache = PayloadKeyCache(store.root)
    entries = [(s, ws, cache.load(s.identity, algo)) for s, ws in per_model]
    index = store.locate({key for _, _, cached in entries for key in cached.values()})
    store_files: dict[str, str] = {}
    for s, ws, cached in entries:
        # one model (and the files it samples) open at a time
        with s.weights.opened(), RangeReader() as files:
            found: dict[TensorPath, str] = {}
            for w in ws:
                key = cached.get(path_str(w.site.path))
                obj = index.get(key) if key else None
                declared = declared_checksum(w.payload)
                if obj is None or (declared is not None and make_key(*declared) != key):
                    continue  # not cached, gone from the store, or a checksum to verify
                if obj.file not in store_files:
                    store_files[obj.file] = str(store.path_of(obj))
                p = w.payload
                mine = (str(p.file), p.offset) if p.encoding == "raw" else s.weights.read(w)
                if obj.size != w.size or not samples_agree(
                        files, mine, (store_files[obj.file], obj.offset), w.size):
                    if forget_bad:
                        cache.drop(s.identity, algo)
                    found = {}
                    break
                found[w.site.path] = key
            for path, key in found.items():
                if path not in s.weights.keys:
                    s.weights.keys[path] = key
                    s.unverified.add(path)


def distrust_cached_keys(sources: list[Source], store: WeightStore, algo: str) -> None:
    """After a :class:`StaleKeyError`: forget every unproven cached key and its entries."""
    cache = PayloadKeyCache(store.root)
    for s in sources:
        if s.unverified:
            cache.drop(s.identity, algo)
        for path in s.unverified:
            s.weights.keys.pop(path, None)
        s.unverified.clear()


def _cached_claims(per_model: list[tuple[Source, list[Weight]]],
                   ) -> dict[str, tuple[Source, Weight]]:
    """Prove or pick a witness for every key some tensor took from the cache unproven.

    The first such tensor of a key is its witness: the package writer copies the payload
    from it and re-hashes the copy. Every other unproven tensor of the key is hashed
    here (duplicates only). Raises :class:`StaleKeyError` for a key that does not match.
    """
    witness: dict[str, tuple[Source, Weight]] = {}
    for s, ws in per_model:
        for w in ws:
            if w.site.path not in s.unverified:
                continue
            if w.key in witness:
                _check_claim(s, w)
            else:
                witness[w.key] = (s, w)
    return witness


def _check_claim(s: Source, w: Weight) -> None:
    algo, expected = split_key(w.key)
    if s.weights.digest(w, algo) != expected:
        raise StaleKeyError("cached payload key does not match the source's bytes",
                            model=s.name, tensor=path_str(w.site.path), key=w.key)
    s.unverified.discard(w.site.path)


def _layout_plan(layout: Layout, per_model: list[tuple[Source, list[tuple[str, int]]]],
                 package: str) -> tuple[LayoutPlan, dict[str, dict[str, PlannedPayload]]]:
    """One plan for the package folder, and each model's key -> planned payload map.

    ``per_model`` lists each model's ``(key, size)`` payloads in first-use order. Separate
    files, and the one ``<package>_weight_combined`` of a ``combined: shared`` layout, are
    shared by every model of the package (each payload once, in recipe then structural
    order); other combined files are per model.
    """
    mode = layout.external_weight
    if mode == "separate" or layout.combined == "shared":
        plan = plan_layout(package, [p for _, ps in per_model for p in ps], mode,
                           layout.alignment)
        where = plan.placement()
        return plan, {s.name: where for s, _ in per_model}
    files: list[PlannedFile] = []
    maps: dict[str, dict[str, PlannedPayload]] = {}
    for s, ps in per_model:
        plan = plan_layout(s.name, ps, mode, layout.alignment)
        files.extend(plan.files)
        maps[s.name] = plan.placement()
    return LayoutPlan(mode, layout.alignment, tuple(files)), maps


def estimated_model_bytes(source: Source, layout: Layout) -> int:
    """An upper bound on the size of ``source``'s packaged model in ``layout``.

    Lets the 2 GiB protobuf limit be checked before the store or the output is touched.
    """
    mw = source.weights
    external: set[TensorPath] = set()
    if layout.external_weight != "embedded":
        external = {w.site.path for w in mw.select(layout.size_threshold, layout.constants)}
    size = mw.catalogue.model.ByteSize()
    for path, desc in mw.descriptors.items():
        if path in external:
            size += 256  # an external_data reference or a FileConstant node
        elif path in mw.catalogue.payloads:
            size += mw.catalogue.payloads[path].stored_bytes
        else:
            size += desc.nbytes + 16  # external in the source, inline in the package
    embedded = layout.external_weight == "embedded"
    for scenario in source.scenarios:  # what the records keep inline
        size += sum(w.nbytes + 16 for w in scenario.added
                    if embedded or w.shape_input or w.nbytes < layout.size_threshold)
        size += sum(r.ByteSize() for r in scenario.records)
    return size


def write_package(recipe: Recipe, layout: Layout, target: Path, fingerprint: str,
                  sources: list[Source], store: WeightStore, jobs: int,
                  progress: bool | None, *, replace: bool = False,
                  companions: PackageCompanions | None = None,
                  accuracy: Callable[[Path, dict[str, str]], list[dict[str, Any]]] | None
                  = None) -> dict[str, Any]:
    """Build one layout's folder under a temp name and rename it into place (``replace``:
    over the folder there; else none may be, see :func:`~weightstore.io.files.publish_dir`).
    ``companions``: files copied in from the store (:func:`store_companions` put them);
    ``accuracy``: the figures the summary records, given the folder written so far and
    its model files by model name (it may refuse the package: nothing is published)."""
    companions = companions or PackageCompanions()
    per_model = []
    for s in sources:
        ws: list[Weight] = []
        if layout.external_weight != "embedded":
            ws = s.weights.hash(s.weights.select(layout.size_threshold, layout.constants),
                                recipe.store.hash, jobs)
        per_model.append((s, ws))
    payloads = [
        (s, [(w.key, w.size) for w in ws] + [(w.key, w.size) for w in s.added_weights(layout)])
        for s, ws in per_model]
    if layout.split == "scenario":
        plan, maps = _split_plan(layout, per_model, payloads, recipe.package, store)
    else:
        plan, maps = _layout_plan(layout, payloads, recipe.package)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = make_temp_dir(target.parent, f".{layout.name}.")
    try:
        # where this package's payloads live (held until the build ends: gc keeps them)
        index = store.locate(
            [p.key for f in plan.files for p in f.payloads]
            + [w.key for s in sources for w in s.added_weights(layout) if w.key]
            + [w.key for s in sources for sc in s.scenarios for w in sc.added if w.key])

        witness = _cached_claims(per_model)

        def locate(key: str) -> FileRange | bytes:
            claim = witness.get(key)
            if claim is not None:  # a cached key: the copy from the source proves it
                s, w = claim
                if w.payload.encoding == "raw":
                    return FileRange(w.payload.file, w.payload.offset)
                return s.weights.read(w)
            obj = index.get(key)
            if obj is None:
                raise StoreError("payload vanished from the store", key=key,
                                 store=str(store.root))
            return FileRange(store.path_of(obj), obj.offset, stored=True)

        with Progress(f"packaging {layout.name}", sum(f.size for f in plan.files),
                      enabled=progress) as bar:
            healed_keys: set[str] = set()
            while True:
                try:
                    written = write_plan(plan, tmp, locate, jobs=jobs,
                                         progress=bar.advance, file_digest=recipe.store.hash,
                                         sync_dir=False)
                    break
                except IntegrityError as exc:
                    key = exc.context.get("key", "")
                    claim = witness.get(key)
                    if claim is not None:
                        raise StaleKeyError("cached payload key does not match the source's "
                                            "bytes", model=claim[0].name,
                                            tensor=path_str(claim[1].site.path),
                                            key=claim[1].key) from exc
                    if key in healed_keys:
                        raise
                    healed_keys.add(key)  # a store object damaged since it was written
                    healed = heal(store, per_model, key, index.get(key))
                    if healed is None:
                        raise
                    index[key] = healed
        for s, w in witness.values():
            s.unverified.discard(w.site.path)
        read_added = _added_reader(store, index)

        models = []
        files = model_files(recipe)
        for s, ws in per_model:
            with s.weights.opened():
                models.append(_write_model(tmp, s, files[s.name], ws, maps.get(s.name, {}),
                                           layout, read_added, written, recipe.store.hash))
        # every layout records its devices; an embedded one's device models hold their
        # live weights inline, as its models do
        devices = _write_devices(tmp, recipe, sources, models, companions)
        if companions:
            written.update(_write_companions(store, tmp, companions.placed(),
                                             plan, recipe.store.hash, jobs))
        from .inventory import package_contents

        figures = [] if accuracy is None else accuracy(tmp, files)
        summary = package_summary(package=recipe.package, version=recipe.version,
                                  layout=layout, hash_algo=recipe.store.hash,
                                  fingerprint=fingerprint, models=models, plan=plan,
                                  devices=devices, companions=companions.top,
                                  accuracy=figures,
                                  contents=package_contents(tmp, recipe.store.hash, jobs,
                                                           known=written))
        # every file is fsynced; the folder once, when it is published
        atomic_write_bytes(tmp / SUMMARY_NAME, render(summary), sync_dir=False)
        publish_dir(tmp, target, replace=replace)
        tmp = None
        return summary
    finally:
        discard_temp_dir(tmp)


def heal(store: WeightStore, per_model: list[tuple[Source, list[Weight]]], key: str | None,
         damaged: StoredObject | None) -> StoredObject | None:
    """Rewrite a damaged store object from a source of this build that holds its bytes (a
    weight of a source model, or one a scenario derives from it), saying so on stderr;
    None when no such source exists (the copy's error, which names the store file, offset
    and the repair command, then stands)."""
    if key is None or damaged is None:
        return None
    source = next((_WeightPayload(s.weights, w) for s, ws in per_model for w in ws
                   if w.key == key), None)
    if source is not None:
        return store.heal(source, damaged)
    added = next((w for s, _ in per_model for sc in s.scenarios for w in sc.added
                  if w.key == key), None)
    return None if added is None else _heal_added(store, added, damaged)[1]


def _heal_added(store: WeightStore, weight: AddedWeight, damaged: StoredObject,
                ) -> tuple[bytes, StoredObject]:
    """A derived weight computed again and its damaged store object rewritten; a weight
    that does not give its cached key is a stale cache."""
    data = weight.bytes()
    algo, expected = split_key(weight.key)
    if digest_bytes(algo, data) != expected:
        raise StaleKeyError("cached key of a derived weight does not match the weight "
                            "computed", weight=weight.where, key=weight.key)
    return data, store.heal(BytesPayload(weight.key, data, weight.where), damaged)

def _added_reader(store: WeightStore, index: dict[str, StoredObject],
                  ) -> Callable[[AddedWeight], bytes]:
    """The bytes of a weight a scenario adds: its store object when the store holds it
    (verified against the key), else computed from the source. A damaged object is
    computed again and rewritten (:func:`heal`)."""
    def read_added(weight: AddedWeight) -> bytes:
        obj = index.get(weight.key) if weight.key else None
        if obj is None:
            return weight.bytes()
        try:
            return store.read(obj)
        except IntegrityError:
            data, index[weight.key] = _heal_added(store, weight, obj)
            return data

    return read_added

def _package_model(source: Source, weights: list[Weight], where: dict[str, PlannedPayload],
                   layout: Layout, read_added: Callable[[AddedWeight], bytes],
                   ) -> ModelProto:
    """The packaged model: weights at their planned places, scenarios attached."""
    placements = {
        w.site.path: Placement(where[w.key].file, where[w.key].offset, w.size, w.key)
        for w in weights
    }
    model = source.weights.materialize(placements, layout.constants)
    if source.scenarios:
        from ..scenarios.package import attach

        placed = {id(w) for w in source.added_weights(layout)}
        attach(model, source.scenarios,
               lambda w: (where[w.key].file, where[w.key].offset) if id(w) in placed else None,
               read_added)
    return model


def _split_plan(layout: Layout, per_model: list[tuple[Source, list[Weight]]],
                payloads: list[tuple[Source, list[tuple[str, int]]]], prefix: str,
                store: WeightStore) -> tuple[LayoutPlan, dict[str, dict[str, PlannedPayload]]]:
    """The seed's kSplitCommonDefaultAndScenario: one group per set of users.

    Every variant (the default graph and each scenario, across the package's models) is
    resolved from metadata; ``users(W)`` is the set of variants in which payload W is live.
    Only the default graph -> ``<prefix>.default.data``; only scenario S ->
    ``<prefix>.S.data``; otherwise ``<prefix>.common.data``. A payload live nowhere still
    belongs to the base graph, so it goes to the default file.
    """
    from ..resolve.variant import variant_graph
    from ..scenarios.resolve import live_payloads

    users: dict[str, set[str]] = {}
    index = store.locate(w.key for s, _ in per_model for sc in s.scenarios for w in sc.added
                         if w.key)

    read_added = _added_reader(store, index)

    # each payload at a location of its own (its key) until the groups are known
    pending = {key: PlannedPayload(key, size, key, 0)
               for _, ps in payloads for key, size in ps}
    scenario_order = package_scenarios(per_model)
    for s, ws in per_model:
        with s.weights.opened():
            model = _package_model(s, ws, pending, layout, read_added)
        own = {sc.name for sc in s.scenarios}
        resolved: dict[str | None, set[str]] = {}
        for name in [None, *scenario_order]:
            # a model without scenario S runs its default graph in variant S
            selected = name if name in own else None
            if selected not in resolved:
                resolved[selected] = {p.location for p in
                                      live_payloads(variant_graph(model, selected),
                                                    selected)}
            for key in resolved[selected]:
                users.setdefault(key, set()).add(name or DEFAULT_GROUP)

    def group(key: str) -> str:
        u = users.get(key, {DEFAULT_GROUP})
        return next(iter(u)) if len(u) == 1 else COMMON_GROUP

    order: list[tuple[str, int]] = []
    seen: set[str] = set()
    for _, ps in payloads:
        for key, size in ps:
            if key not in seen:
                seen.add(key)
                order.append((key, size))
    suffix = ".data" if layout.external_weight == "combined" else ""  # separate: folders
    groups = [(f"{prefix}.{g}{suffix}", [(k, n) for k, n in order if group(k) == g])
              for g in (COMMON_GROUP, DEFAULT_GROUP, *scenario_order)]
    plan = plan_groups([g for g in groups if g[1]], layout.external_weight, layout.alignment)
    where = plan.placement()
    return plan, {s.name: where for s, _ in per_model}


def package_scenarios(per_model) -> list[str]:
    """Every scenario name of the package's models, in first-seen order."""
    names: list[str] = []
    for s, _ in per_model:
        for sc in s.scenarios:
            if sc.name not in names:
                names.append(sc.name)
    return names


def offered_scenarios(recipe: Recipe, sources: list[Source]) -> list[tuple[str, dict]]:
    """What 'auto' devices choose from, in order: the recipe's scenarios, then those the
    source models already held, each with its requirements."""
    offered: dict[str, dict] = {}
    for m in recipe.models:
        for sc in m.scenarios:
            offered.setdefault(sc.name, dict(sc.requires))
    for s in sources:
        for sc in s.scenarios:
            offered.setdefault(sc.name, sc.requires)
    return list(offered.items())


def _write_devices(folder: Path, recipe: Recipe, sources: list[Source],
                   summaries: list[ModelSummary],
                   companions: PackageCompanions) -> list[dict]:
    """``devices/<name>/`` for every device of the recipe (see
    :mod:`weightstore.packaging.bundles`), its record listing the store keys
    ``summaries`` give the live weights and the device's companion files; returns what
    the summary records of the devices (their own companion files are written later)."""
    if not recipe.devices:
        return []
    from ..io.onnx_proto import read_model
    from .bundles import select_scenario, write_device

    offered = offered_scenarios(recipe, sources)
    keys = {m.name: {(w.location, w.offset): w.id for w in m.external} for m in summaries}
    files = {m.name: m.file for m in summaries}
    models = []
    for s in sources:
        model = read_model(folder / files[s.name])
        models.append((s.name, model, {sc.name for sc in s.scenarios}))
    out = []
    for device in recipe.devices:
        chosen = select_scenario(device, offered)
        own = [c.to_dict() for c in companions.device_set(device.name)]
        record = write_device(folder, device, [
            (name, files[name], model, chosen if chosen in names else None, keys[name])
            for name, model, names in models], recipe.store.hash, own)
        entry = {"name": device.name, "scenario": chosen,
                 "files": [f"devices/{device.name}/{m['file']}" for m in record["models"]]
                 + [f"devices/{device.name}/bundle.json"]
                 + [device_path(device.name, c.path)
                    for c in companions.devices.get(device.name, ())]}
        if own:
            entry["companions"] = own
        out.append(entry)
    return out


def model_files(recipe: Recipe) -> dict[str, str]:
    """Each model's file name in the package, by model name."""
    from ..recipe.schema import model_file_name

    return {m.name: model_file_name(m) for m in recipe.models}


def _write_model(folder: Path, source: Source, file_name: str, weights: list[Weight],
                 where: dict[str, PlannedPayload], layout: Layout,
                 read_added: Callable[[AddedWeight], bytes], written: dict[str, str],
                 algo: str) -> ModelSummary:
    """Write one packaged model at ``file_name``; its digest, from the bytes written, goes
    to ``written``."""
    model = _package_model(source, weights, where, layout, read_added)
    added = source.added_weights(layout)
    data = serialize_model(model, file_name)
    atomic_write_bytes(folder / file_name, data, sync_dir=False)  # a temp folder
    written[file_name] = make_key(algo, digest_bytes(algo, data))
    size = len(data)
    placed = {w.site.path for w in weights}
    inline = [d for p, d in source.weights.descriptors.items() if p not in placed]
    external = tuple(
        ExternalWeightDesc(
            id=w.key, name=w.site.value_name, where=w.site.where,
            location=where[w.key].file, offset=where[w.key].offset, size=w.size,
            dtype=TensorProto.DataType.Name(w.site.tensor.data_type),
            shape=tuple(w.site.tensor.dims))
        for w in weights)
    external += tuple(
        ExternalWeightDesc(
            id=w.key, name=w.name, where=w.where, location=where[w.key].file,
            offset=where[w.key].offset, size=w.size,
            dtype=TensorProto.DataType.Name(w.data_type), shape=w.dims,
            scenario=w.scenario)
        for w in added)
    return ModelSummary(
        name=source.name, file=file_name, model_bytes=size,
        source_digest=source.identity["source_digest"],
        external_sources=source.identity["external"],
        inline_tensors=len(inline),
        inline_bytes=sum(expected_nbytes(d.data_type, d.dims) or d.length for d in inline),
        external=external,
        scenarios=tuple(sc.name for sc in source.scenarios))
