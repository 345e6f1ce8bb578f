"""``weightstore build``: recipe -> catalogue -> store -> packages, end to end.

Order matters for users' data: everything that can be refused (recipe, models, store path,
existing output) is checked before the store or the output folder is touched; packages are
written into a temp folder and renamed into place only when complete.

An up-to-date package is recognised from its ``summary.json`` alone: the fingerprint is
recomputed from the recipe and the content digests of the source files the summary lists,
without importing onnx or reading the models' structure.

Package tree (one folder per layout)::

    <output>/<package>/<version>/<layout>/
        <model>.onnx                 one per model, external data relative to this folder
        weight_<hex>                 separate layout: one file per distinct payload
        <model>_weight_combined      combined layout: payloads at aligned offsets
        <package>_weight_combined    combined: shared: one file for all models instead
        summary.json                 ExternalWeightDesc list, totals, fingerprint
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..caches import build_stamp
from ..catalogue.locations import resolve_location
from ..errors import (
    ExternalDataError,
    IntegrityError,
    PackageError,
    RecipeError,
    StoreError,
    WeightstoreError,
)
from ..io.files import check_output_folder
from ..io.workers import default_jobs
from ..package.fingerprint import CACHE_NAME, FileDigests, layout_fingerprint
from ..package.summary import CONTENTS_SINCE, SUMMARY_NAME, written_format_version
from ..package.summary import FORMAT_VERSION as SUMMARY_FORMAT_VERSION
from ..recipe.file import read_recipe_file
from ..store.location import resolve_store_path
from ..version import __version__
from .accuracy import samples_digest

if TYPE_CHECKING:  # the recipe's models (pydantic, yaml) load only when the stamp misses
    from ..packaging.materialize import Materialized
    from ..recipe.schema import Layout, LoadedRecipe, ModelEntry, Recipe
    from .accuracy import Gate
    from .companions import Companion


@dataclass(frozen=True)
class BuildOptions:
    """How :func:`build` runs: the command line's options of ``weightstore build``.

    ``store`` beats the recipe's ``store.path``, ``$WEIGHTSTORE_DIR`` and the user cache
    folder; ``jobs`` bounds the hashing and copying threads (packages are byte-identical
    whatever it is); ``force`` rebuilds up-to-date packages and replaces a folder holding
    a different build; ``models`` and ``layouts`` select part of the recipe; ``dry_run``
    reports the plan and writes nothing; ``progress`` None draws bars only on a terminal.
    """

    store: str | None = None  # --store flag; highest priority
    jobs: int = default_jobs()
    force: bool = False  # rebuild and replace packages, even up-to-date or different ones
    progress: bool | None = None  # None: only on an interactive terminal
    models: tuple[str, ...] = ()  # --model: package only these (all when empty)
    layouts: tuple[str, ...] = ()  # --layout: build only these (all when empty)
    dry_run: bool = False  # report what would be built, written and reused; write nothing
    # a registry-backed build cache (:mod:`.remote_cache`): ``cache`` read and written,
    # ``cache_from`` read, ``cache_to`` written (signed with ``cache_key``, a private key
    # file, else $WEIGHTSTORE_SIGNING_KEY); none given: $WEIGHTSTORE_CACHE and friends
    cache: str | None = None
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    cache_key: str | None = None


@dataclass
class PackageResult:
    """One package folder of a build: its layout, where it is, what the build did to it
    (``status``) and its ``summary.json`` as a mapping (docs/reference/formats/package.md)."""

    layout: str
    path: Path
    status: str  # "built" | "up-to-date" | "would-build" | "would-materialize" (dry run)
    summary: dict[str, Any]
    cache: str | None = None  # the build cache repository it was fetched from
    cache_bytes: int = 0  # the bytes read from it (signed record and package)


REPORT_KEYS = ("written_objects", "written_bytes", "reused_objects", "reused_bytes",
               "padding_bytes")


@dataclass
class BuildResult:
    """What :func:`build` did: the store it used, each package in recipe order, and the
    store's counts (objects and bytes written and reused, alignment padding)."""

    store: Path
    packages: list[PackageResult] = field(default_factory=list)
    # every count, zero when the store was not touched (an up-to-date build)
    store_report: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPORT_KEYS, 0))

    def to_dict(self) -> dict[str, Any]:
        """What ``build --json`` prints (docs/reference/formats/build-records.md, "Build
        report")."""
        return {
            "store": str(self.store),
            "store_report": self.store_report,
            "packages": [{"layout": p.layout, "path": str(p.path), "status": p.status,
                          "summary": p.summary, "cache": p.cache,
                          "cache_bytes": p.cache_bytes} for p in self.packages],
        }


def build(recipe: str | os.PathLike[str] | Recipe | Mapping[str, Any] | LoadedRecipe,
          options: BuildOptions | None = None, *,
          base_dir: str | os.PathLike[str] | None = None) -> BuildResult:
    """Build every layout of ``recipe`` (selected by ``options``) into its package folder.

    ``recipe`` is a recipe file, a :class:`~weightstore.recipe.schema.Recipe` or a mapping of the
    recipe's YAML form (or a recipe already loaded); relative paths are taken from the
    file's folder, or ``base_dir`` (default: the current folder) for an object or mapping.
    An unchanged package is reported ``up-to-date`` and nothing is written; a recipe file
    whose bytes, sources and packages match its build stamp is decided without being
    parsed (:mod:`.caches.build_stamp`). A missing package folder whose build the store
    already holds is materialized from the store by its action record instead of being
    converted again (:mod:`weightstore.packaging.materialize`; never with ``force``).
    """
    options = options or BuildOptions()
    if not isinstance(recipe, (str, os.PathLike)):
        from ..recipe.schema import LoadedRecipe, loaded_from

        if isinstance(recipe, LoadedRecipe):
            return _build(recipe, options)
        return _build(loaded_from(recipe, base_dir or os.curdir), options)
    absolute, data = read_recipe_file(recipe)
    stamp = build_stamp.Invocation(absolute, tuple(options.models), tuple(options.layouts),
                                   resolve_store_path(options.store, None))
    seen: list[FileDigests] = []  # digests the stamp's check took: never taken twice
    # a build that writes a cache asks it for every package: never decided by the stamp
    # (a recipe whose own ``cache`` writes is not stamped)
    if not options.force and not options.dry_run and not _writes_cache(options):
        done = _stamped(stamp, data, options.jobs, seen)
        if done is not None:
            return done
    from ..recipe.schema import load_recipe_bytes

    loaded = load_recipe_bytes(absolute, data, os.fspath(recipe))
    return _build(loaded, options, stamp=(stamp, data), seen=seen)


def _stamped(stamp: build_stamp.Invocation, data: bytes, jobs: int,
             seen: list[FileDigests]) -> BuildResult | None:
    """The result of a build proven by the stamp, None when it proves nothing.

    Packages in place must be up to date; a missing package folder is materialized from
    the store by its fingerprint's action record (:mod:`weightstore.packaging.materialize`), which
    needs neither onnx, numpy nor pydantic."""
    doc = build_stamp.load(stamp, data)
    if doc is None:
        return None
    store_root = Path(doc["store"])
    digests = FileDigests(store_root / CACHE_NAME)
    seen.append(digests)
    if not _can_materialize(doc, store_root):
        # the full build follows: its sources are hashed meanwhile, on the second CPU
        digests.prefetch(Path(model) for model in doc["sources"])
        return None
    if not build_stamp.sources_unchanged(doc, digests):
        return None
    result = BuildResult(store_root)
    missing = []
    for p in doc["packages"]:
        target = Path(p["path"])
        try:
            check_output_folder(target)
            summary = _existing_summary(target, force=False)
        except PackageError:
            return None
        if summary is None:
            missing.append((p, target))
            continue
        if (summary.get("fingerprint") != p["fingerprint"]
                or not _intact(target, summary, digests, store_root)):
            return None
        result.packages.append(PackageResult(p["layout"], target, "up-to-date", summary))
        _ensure_root(store_root, target, summary)
    if missing:
        from ..packaging.materialize import materialize

        for p, target in missing:
            done = materialize(store_root, target, p["fingerprint"], jobs=jobs)
            if done is None:
                return None  # the full build decides (what was published stays valid)
            result.packages.append(PackageResult(p["layout"], target, "built", done.summary))
            _count_reused(result, done)
        order = [p["layout"] for p in doc["packages"]]
        result.packages.sort(key=lambda r: order.index(r.layout))
    digests.save()
    return result


def _can_materialize(doc: dict[str, Any], store_root: Path) -> bool:
    """Has every package folder the stamp names that is missing a sound action record?"""
    missing = [p for p in doc["packages"] if not Path(p["path"]).exists()]
    if not missing:
        return True
    from ..caches import build_actions

    return all(build_actions.load(store_root, p["fingerprint"]) is not None for p in missing)


def _count_reused(result: BuildResult, done: Materialized) -> None:
    """A materialized package writes nothing to the store and reuses all its payloads."""
    for k, v in (("written_objects", 0), ("written_bytes", 0), ("padding_bytes", 0),
                 ("reused_objects", done.reused_objects), ("reused_bytes", done.reused_bytes)):
        result.store_report[k] = result.store_report.get(k, 0) + v


def _build(loaded: LoadedRecipe, options: BuildOptions,
           stamp: tuple[build_stamp.Invocation, bytes] | None = None,
           seen: list[FileDigests] | None = None) -> BuildResult:
    from ..recipe.selection import select_part

    loaded = select_part(loaded, options.models, options.layouts)
    recipe = loaded.recipe
    store_root = resolve_store_path(options.store, loaded.store_path())
    if store_root.exists() and not store_root.is_dir():
        raise StoreError("store path exists and is not a folder", path=str(store_root))
    result = BuildResult(store_root)
    digests = next((d for d in seen or () if d.cache_file == store_root / CACHE_NAME),
                   None) or FileDigests(store_root / CACHE_NAME)
    digests.prefetch(loaded.model_source(m) for m in loaded.models()  # while onnx loads
                     if isinstance(m.source, str))
    companions = _companions(loaded, digests)
    pending: list[tuple[Layout, Path, dict[str, Any] | None]] = []
    for layout in recipe.layouts:
        target = _target(loaded, layout)
        check_output_folder(target)
        existing = _existing_summary(target, options.force)
        if (existing is not None and not options.force
                and _up_to_date(loaded, layout, target, existing, digests, store_root,
                                companions)):
            result.packages.append(PackageResult(layout.name, target, "up-to-date", existing))
            _ensure_root(store_root, target, existing)
        else:
            pending.append((layout, target, existing))
    # the cache (its key read) before anything is built
    cache = None if options.dry_run else _cache_settings(options, recipe.cache)
    converted: set[Path] = set()
    if pending:
        converted = _build_pending(loaded, pending, store_root, digests, options, result,
                                   cache, companions)
    if not options.dry_run:
        digests.save()
    if cache is not None and cache.write is not None:
        from ..store import WeightStore
        from .remote_cache import store_entries

        store_entries(cache, [(p.path, p.summary, p.path in converted)
                              for p in result.packages if p.cache != cache.write],
                      WeightStore(store_root), options.jobs)
    order = {layout.name: i for i, layout in enumerate(recipe.layouts)}
    result.packages.sort(key=lambda p: order[p.layout])
    if stamp is not None and result.packages and not options.dry_run:
        _record_stamp(loaded, stamp, store_root, result, companions, digests)
    return result


def _companions(loaded: LoadedRecipe, digests: FileDigests) -> list[Companion]:
    """The recipe's companion files, listed and hashed (none without ``files``)."""
    if not loaded.recipe.has_companions:
        return []
    from .companions import companion_files, hashed

    return hashed(companion_files(loaded), digests, loaded.recipe.store.hash)


def _record_stamp(loaded: LoadedRecipe, stamp: tuple[build_stamp.Invocation, bytes],
                  store_root: Path, result: BuildResult, companions: list[Companion],
                  digests: FileDigests) -> None:
    """Stamp this build with the source identities its packages' summaries record, its
    samples files' digests and the files each companion source gave it, with the digests
    it took (not a recipe with pinned sources: no local file stands for them; its full
    check needs none either; nor one that writes a build cache, asked at every build)."""
    recipe = loaded.recipe
    entries = [*recipe.files, *(f for d in recipe.devices for f in d.files)]
    if any(not isinstance(entry.source, str) for entry in [*loaded.models(), *entries]):
        return
    if _writes_cache(None, loaded.recipe.cache):
        return
    listed = {m["name"]: m for m in result.packages[0].summary["models"]}
    sources = {str(loaded.model_source(entry)):
               {"digest": listed[entry.name]["source_digest"],
                "external": listed[entry.name]["external_sources"]}
               for entry in loaded.models()}
    for entry in loaded.models():  # a samples file is watched as a source is
        samples = loaded.samples_of(entry)
        if samples is not None:
            sources[str(samples)] = {"digest": samples_digest(loaded, entry, digests),
                                     "external": {}}
    from ..recipe.companions import source_files

    built = {c.file: c.digest for c in companions}
    given: dict[str, dict[str, str]] = {}
    try:
        for e in entries:
            files = source_files(loaded.resolve(e.source))
            given[str(loaded.resolve(e.source))] = {rel: built[path] for rel, path in files}
    except (KeyError, RecipeError):
        return  # a file added or gone since the build listed them: nothing to stamp
    build_stamp.record(stamp[0], stamp[1], store_root, sources,
                       [(p.layout, p.path, p.summary["fingerprint"]) for p in result.packages],
                       given)


def _target(loaded: LoadedRecipe, layout: Layout) -> Path:
    r = loaded.recipe
    return loaded.output_dir() / r.package / r.version / layout.name


def _fingerprint(loaded: LoadedRecipe, layout: Layout, identities: list[dict[str, Any]],
                 companions: list[Companion]) -> str:
    from .companions import identities as companion_identities

    r = loaded.recipe
    return layout_fingerprint(package=r.package, version=r.version, hash_algo=r.store.hash,
                              layout=layout, models=identities,
                              devices=[d.model_dump(mode="json") for d in r.devices],
                              companions=companion_identities(companions))


def _existing_summary(target: Path, force: bool) -> dict[str, Any] | None:
    """The summary of the package folder at ``target``, None when there is no folder.

    A folder that is not a package is refused (``force`` replaces it).
    """
    from ..io.files import parse_json, read_regular

    if not target.exists():
        return None
    try:
        summary = parse_json(read_regular(target / SUMMARY_NAME))
        if not isinstance(summary, dict) or "fingerprint" not in summary:
            raise ValueError("not a summary")
    except (OSError, ValueError):
        if force:
            return None
        raise PackageError("output folder already holds something that is not a package; "
                           "pass --force to replace it", folder=str(target)) from None
    version = summary.get("format_version")
    if not isinstance(version, int) or version > SUMMARY_FORMAT_VERSION:
        if force:
            return None
        raise PackageError("output folder holds a package of a format this weightstore "
                           "does not know; pass --force to replace it", folder=str(target),
                           format_version=version)
    return summary


def _up_to_date(loaded: LoadedRecipe, layout: Layout, target: Path, summary: dict[str, Any],
                digests: FileDigests, store_root: Path, companions: list[Companion]) -> bool:
    """Would building ``layout`` give exactly the package at ``target``?

    The sources' identities are recomputed from the files the summary lists. If a model
    changed, its digest differs and so does the fingerprint; if it did not, it references
    the very external files listed.
    """
    try:
        listed = {m["name"]: m for m in summary["models"]}
        identities = []
        for entry in loaded.models():
            previous = listed.get(entry.name)
            if previous is None:
                return False
            samples = samples_digest(loaded, entry, digests)
            if not isinstance(entry.source, str):  # pinned: by its digest, no file
                identities.append(_pinned_identity(entry, samples))
                continue
            source = loaded.model_source(entry)
            external = {}
            for location in previous.get("external_sources", {}):
                external[location] = digests.of(resolve_location(source.parent, location,
                                                                 where=entry.name))
            identities.append(_identity(entry, digests.of(source), external, samples))
    except (KeyError, TypeError, AttributeError, OSError, ExternalDataError, IntegrityError):
        return False  # a source that cannot be hashed: the build reports it, as on a first build
    if _fingerprint(loaded, layout, identities, companions) != summary.get("fingerprint"):
        return False
    return _intact(target, summary, digests, store_root, _device_names(loaded.recipe))


def _device_names(recipe: Recipe) -> list[str]:
    """The devices every package of ``recipe`` lists, by name, in order."""
    return [d.name for d in recipe.devices]


PROVEN = "proven"  # the store's record names this summary, and the files agree with it
UNRECORDED = "the store holds no sound record of this build"
OTHER_SUMMARY = "the store recorded another summary.json for its fingerprint"
DAMAGED = "damaged"  # the files do not agree with the folder's own summary
OLDER_FORMAT = "older format"  # intact, but this version writes the build otherwise


def _intact(target: Path, summary: dict[str, Any], digests: FileDigests,
            store_root: Path, devices: Sequence[str] | None = None) -> bool:
    """The folder is the build, proven (:func:`_proof`)."""
    return _proof(target, summary, digests, store_root, devices) == PROVEN


def _proof(target: Path, summary: dict[str, Any], digests: FileDigests,
           store_root: Path, devices: Sequence[str] | None = None) -> str:
    """What the store proves about the folder: :data:`PROVEN`, the store's MAC'd action
    record names this very summary (:mod:`weightstore.packaging.proof`) and every file the summary
    lists is there with its digest (through the stat cache: a file rewritten since it was
    last hashed is hashed again, so a change is never missed); :data:`UNRECORDED` or
    :data:`OTHER_SUMMARY`, the files agree with the summary but the store does not prove
    that summary is the build's (the build rebuilds it); :data:`OLDER_FORMAT`, the files
    agree with a summary of an older package format, which this version writes otherwise,
    or one that does not list the recipe's ``devices`` (names, in order: the fingerprint
    covers them, so only an earlier version, which wrote no devices into an embedded
    layout's package, left them out; None: not asked) (rewritten without a word: it is
    the same build); :data:`DAMAGED` otherwise."""
    from ..packaging.inventory import verify_package

    version = summary.get("format_version")
    if not isinstance(version, int) or version < CONTENTS_SINCE:
        return DAMAGED  # no file digests to check against
    try:
        report = verify_package(target, digest=lambda algo, path: digests.of(path, algo),
                                store=store_root)
    except (OSError, WeightstoreError):
        return DAMAGED
    # files the summary does not list are not part of the package (verify reports them)
    if any(p.kind not in ("unexpected", "build") for p in report.problems):
        return DAMAGED
    try:
        written = written_format_version(summary)
        listed = [d["name"] for d in summary.get("devices", [])]
    except (KeyError, TypeError, AttributeError):
        return DAMAGED
    if version < written or (devices is not None and listed != list(devices)):
        return OLDER_FORMAT
    if any(p.kind == "build" for p in report.problems):
        return OTHER_SUMMARY
    return PROVEN if report.recorded else UNRECORDED


def _build_pending(loaded: LoadedRecipe, pending: list[tuple[Layout, Path, dict | None]],
                   store_root: Path, digests: FileDigests, options: BuildOptions,
                   result: BuildResult, cache: Any, companions: list[Companion]) -> set[Path]:
    """Materialize, fetch (``cache``) or convert the pending layouts; the folders of
    those converted."""
    # onnx and the catalogue: only when something must be built
    from ..caches.payload_keys import StaleKeyError
    from ..io.models import PROTOBUF_LIMIT
    from ..packaging import write as packaging
    from ..scenarios.storage import read_scenarios
    from ..store import WeightStore
    from .accuracy import gate as accuracy_gate
    from .sources import pinned_path

    recipe = loaded.recipe
    models = loaded.models()
    local = [m for m in models if isinstance(m.source, str)]  # pinned: fetched to convert
    opened = dict(zip([m.name for m in local], packaging.open_sources(
        [(m.name, loaded.model_source(m)) for m in local]), strict=True))
    sources: list = []
    try:
        identities = []
        for entry in models:
            s = opened.get(entry.name)
            samples = samples_digest(loaded, entry, digests)
            if s is None:
                identities.append(_pinned_identity(entry, samples))
                continue
            s.identity = _identity(
                entry, digests.of(s.weights.catalogue.source),
                {loc: digests.of(path) for loc, path in s.external_files}, samples)
            identities.append(s.identity)
        if len(opened) == len(models):
            _check_devices(loaded, list(opened.values()))
        todo = []
        for layout, target, existing in pending:
            fp = _fingerprint(loaded, layout, identities, companions)
            if existing is not None and not options.force:
                _refuse(target, existing, fp, layout, identities, loaded.recipe, companions,
                        proof=_same_build_proof(target, existing, fp, digests, store_root,
                                                  _device_names(loaded.recipe)))
            todo.append((layout, target, fp))
        if not options.force and not options.dry_run:
            todo = [t for t in todo if not _materialized(store_root, *t, options, result)]
            if cache is not None and cache.read:
                todo = [t for t in todo if not _fetched(cache, store_root, *t, options, result)]
            if not todo:
                return set()
        # what converts needs every source: the pinned ones are fetched (once) now
        for entry, identity in zip(models, identities, strict=True):
            if entry.name not in opened:
                path = pinned_path(entry, store_root, digests)
                opened[entry.name] = packaging.open_sources([(entry.name, path)])[0]
                opened[entry.name].identity = identity
        sources = [opened[m.name] for m in models]
        if any(c.pin is not None for c in companions):
            from .companions import fetched

            companions = fetched(companions, store_root, digests, recipe.store.hash)
        if len(local) != len(models):
            _check_devices(loaded, sources)
        for layout, _, _ in todo:
            for s in sources:
                size = packaging.estimated_model_bytes(s, layout)
                if size > PROTOBUF_LIMIT:
                    raise PackageError("model would exceed protobuf's 2 GiB limit; use an "
                                       "external weight layout or a lower size_threshold",
                                       model=s.name, layout=layout.name, size=size)
        # the scenarios (onnx, each replayed): only for what is converted or planned
        for s, entry in zip(sources, models, strict=True):
            if entry.scenarios or read_scenarios(s.weights.catalogue.model):
                from ..scenarios.package import prepare_scenarios

                with s.weights.opened():
                    s.scenarios = prepare_scenarios(s.weights, entry.scenarios)
                _warn_idle(s.name, s.scenarios)
        store = WeightStore(store_root)
        # the samples read and checked before anything is stored
        measure = None if options.dry_run else accuracy_gate(loaded, sources, digests)
        if options.dry_run:
            result.store_report = packaging.plan_store(
                store, sources, [layout for layout, _, _ in todo], recipe.store.hash,
                options.jobs, options.progress, [c.entry() for c in companions])
            from ..packaging.materialize import can_materialize

            result.packages += [
                PackageResult(layout.name, target, "would-materialize"
                              if layout.external_weight != "embedded" and not options.force
                              and can_materialize(store_root, target, fp)
                              else "would-build", {})
                for layout, target, fp in todo]
            return set()
        converting = {target for _, target, _ in todo}
        with store.leased():  # gc spares every key this build relies on until it ends
            try:
                _fill_and_write(loaded, todo, sources, store, digests, options, result,
                                companions, measure)
            except StaleKeyError:
                # a damaged payload-key cache: forget it and hash every key (once)
                packaging.distrust_cached_keys(sources, store, recipe.store.hash)
                _fill_and_write(loaded, todo, sources, store, digests, options, result,
                                companions, measure, trust_cache=False)
        return {p.path for p in result.packages if p.path in converting
                and p.status == "built"}
    finally:
        packaging.close_sources(list(opened.values()))


def _materialized(store_root: Path, layout: Layout, target: Path, fingerprint: str,
                  options: BuildOptions, result: BuildResult) -> bool:
    """Publish a missing package folder from the store by its action record (no
    conversion); False when there is none or the store cannot serve it."""
    if target.exists() or layout.external_weight == "embedded":
        return False
    from ..packaging.materialize import materialize

    done = materialize(store_root, target, fingerprint, jobs=options.jobs)
    if done is None:
        return False
    result.packages.append(PackageResult(layout.name, target, "built", done.summary))
    _count_reused(result, done)
    return True


def _cache_settings(options: BuildOptions, configured: Any) -> Any:
    from .remote_cache import settings

    return settings(options.cache, options.cache_from, options.cache_to, options.cache_key,
                    recipe=configured)


def _writes_cache(options: BuildOptions | None, configured: Any = None) -> bool:
    """Do the options (or, without options, the recipe's ``cache``) or the environment
    write a build cache?"""
    from .remote_cache import writes

    if options is None:
        return writes(None, (), None, recipe=configured)
    return writes(options.cache, options.cache_from, options.cache_to)


def _fetched(cache: Any, store_root: Path, layout: Layout, target: Path, fingerprint: str,
             options: BuildOptions, result: BuildResult) -> bool:
    """Publish a missing package folder from the build cache (its signed entry, pulled
    by the digest it signs); False on any miss. An ``embedded`` layout too: its entry is
    its folder, as every layout's (the store cannot materialize it; a cache can)."""
    if target.exists():
        return False
    from ..caches import build_actions
    from ..package.summary import read_summary_file
    from ..store import WeightStore
    from .remote_cache import fetch

    store = WeightStore(store_root)
    with store.leased():
        found = fetch(cache, fingerprint, target, store, options.jobs)
        if found is None:
            return False
        repository, received = found
        summary = read_summary_file(target)[1]
        stored = build_actions.record(store, target, summary, jobs=options.jobs)
    for k, v in stored.items():
        result.store_report[k] = result.store_report.get(k, 0) + v
    result.packages.append(PackageResult(layout.name, target, "built", summary,
                                         cache=repository, cache_bytes=received))
    return True


def _fill_and_write(loaded: LoadedRecipe, todo: list[tuple[Layout, Path, str]],
                    sources: list, store: Any, digests: FileDigests, options: BuildOptions,
                    result: BuildResult, companions: list[Companion], measure: Gate | None,
                    *, trust_cache: bool = True) -> None:
    """Fill the store for ``todo``'s layouts and write them (``measure``: the accuracy
    gate each package's summary records); each layout written is removed from
    ``todo``."""
    from ..caches import build_actions
    from ..io.locks import target_lock
    from ..packaging import write as packaging
    from ..packaging.materialize import register_root

    recipe = loaded.recipe
    report = packaging.fill_store(
        store, sources, [layout for layout, _, _ in todo], recipe.store.hash,
        options.jobs, options.progress, trust_cache=trust_cache)
    if companions:
        report = packaging.store_companions(
            store, [(c.entry(), c.file) for c in companions if c.file is not None], report)
    for k, v in report.items():
        result.store_report[k] = result.store_report.get(k, 0) + v
    while todo:
        layout, target, fp = todo[0]
        with target_lock(target, store.root):
            # another build may have published here since the first look
            existing = _existing_summary(target, options.force)
            proof = None
            if existing is not None and not options.force:
                proof = _same_build_proof(target, existing, fp, digests, store.root,
                                          _device_names(recipe))
                if proof == PROVEN:
                    result.packages.append(
                        PackageResult(layout.name, target, "up-to-date", existing))
                    todo.pop(0)
                    continue
                _refuse(target, existing, fp, layout, [s.identity for s in sources],
                        recipe, companions, proof=proof)
            summary = packaging.write_package(recipe, layout, target, fp, sources, store,
                                              options.jobs, options.progress,
                                              replace=options.force or existing is not None,
                                              companions=_package_companions(companions),
                                              accuracy=measure)
            # its other files go into the store too: a later build materializes it
            stored = build_actions.record(store, target, summary, jobs=options.jobs)
            register_root(store, target, summary)
            if proof in (UNRECORDED, OTHER_SUMMARY):
                print(f"weightstore: {target}: not proven to be the build ({proof}); "
                      "rebuilt", file=sys.stderr, flush=True)
        for k, v in stored.items():
            result.store_report[k] = result.store_report.get(k, 0) + v
        result.packages.append(PackageResult(layout.name, target, "built", summary))
        todo.pop(0)


def _package_companions(companions: list[Companion]) -> Any:
    """What the package writer takes of the companions: the top-level ones, and each
    device's own (by device name)."""
    from ..packaging.write import PackageCompanions

    devices: dict[str, list] = {}
    for c in companions:
        if c.device is not None:
            devices.setdefault(c.device, []).append(c.entry())
    return PackageCompanions([c.entry() for c in companions if c.device is None], devices)


def _ensure_root(store_root: Path, target: Path, summary: dict[str, Any]) -> None:
    """An up-to-date package registers its root if the store lacks it (a store migrated
    from format 1, or a root dropped by ``store rm``), so that gc keeps what it uses; on
    every path that finds it up to date, the build stamp's as the full check's."""
    from ..store.index import Index
    from ..store.layout import is_store

    try:  # a format 1 store (no index yet) too: registering migrates it
        if summary["layout"]["external_weight"] == "embedded" or not is_store(store_root):
            return
        from ..packaging.materialize import register_root
        from ..store.roots import is_registered

        with Index(store_root).reading() as conn:  # the usual case: one indexed lookup
            if is_registered(conn, str(target.absolute()), summary["fingerprint"]):
                return
        from ..store import WeightStore

        register_root(WeightStore(store_root), target, summary)
    except (StoreError, KeyError, TypeError):
        pass  # a store that cannot take it costs only gc's protection, never the build


def _warn_idle(model: str, scenarios: list) -> None:
    """One stderr line per scenario of the recipe with a pass that found nothing to
    rewrite (cast-fp16 on a model without float32 matrices, quantize-weights without a
    MatMul): the build goes on, the scenario holds what the other passes did, and a
    scenario of no record at all runs the base graph on its devices."""
    for scenario in scenarios:
        if not scenario.idle:
            continue
        passes = ", ".join(dict.fromkeys(scenario.idle))
        print(f"weightstore: warning: model '{model}', scenario '{scenario.name}': "
              f"{passes} found nothing to rewrite"
              + ("; the scenario is the base graph" if not scenario.records else ""),
              file=sys.stderr, flush=True)


def _check_devices(loaded: LoadedRecipe, sources: list) -> None:
    """A device may name a scenario the recipe defines or a source model already holds.

    Building part of a recipe, a scenario of a model left out still counts: the models
    packaged run their default graph there, as in a build of the whole recipe.
    """
    from ..scenarios.storage import read_scenarios

    known = {sc.scenario for s in sources for sc in read_scenarios(s.weights.catalogue.model)}
    known |= {sc.name for m in loaded.recipe.models for sc in m.scenarios}
    for i, device in enumerate(loaded.recipe.devices):
        if device.scenario not in (None, "auto") and device.scenario not in known:
            raise RecipeError(f"device '{device.name}' names scenario '{device.scenario}', "
                              "which no model defines or holds", file=str(loaded.path),
                              key=f"devices[{i}].scenario")


def _identity(entry: ModelEntry, source_digest: str, external: dict[str, str],
              samples: str | None = None) -> dict[str, Any]:
    """What a model contributes to a package's fingerprint (its ``file`` only when the
    recipe names one, the digest of its ``samples`` only when it has some: other
    fingerprints are unchanged)."""
    out = {"name": entry.name, "source_digest": source_digest, "external": external,
           "scenarios": [sc.record() for sc in entry.scenarios]}
    if entry.file is not None:
        out["file"] = entry.file
    if samples is not None:
        out["samples"] = samples
    return out


def _pinned_identity(entry: ModelEntry, samples: str | None) -> dict[str, Any]:
    """A pinned source's part of the fingerprint: the digest it is pinned by (and, for a
    file of an artifact, its path there) in place of its content's, so that deciding a
    build needs no source byte."""
    pin = entry.source
    assert not isinstance(pin, str)
    identity = _identity(entry, pin.digest, {}, samples)
    if pin.ref is not None:
        identity["pinned"] = {"ref": pin.ref, "path": pin.path}
    return identity


def _same_build_proof(target: Path, existing: dict[str, Any], fingerprint: str,
                      digests: FileDigests, store_root: Path,
                      devices: Sequence[str]) -> str | None:
    """:func:`_proof` of a folder holding this build's fingerprint (and ``devices``);
    None for another."""
    if existing.get("fingerprint") != fingerprint:
        return None
    return _proof(target, existing, digests, store_root, devices)


def _refuse(target: Path, existing: dict[str, Any], fingerprint: str,
            layout: Layout | None = None, identities: list[dict[str, Any]] | None = None,
            recipe: Recipe | None = None, companions: list[Companion] | None = None, *,
            proof: str | None) -> None:
    """Refuse to replace a folder of another build, or a damaged one (``--force``
    replaces it); a folder of this build's fingerprint that the store does not prove to
    be the build (``proof``: :func:`_proof`) is rebuilt: the rebuild is what the recipe
    makes, and gives a genuine folder its own bytes again."""
    version = existing.get("format_version")
    different = existing.get("fingerprint") != fingerprint
    if not different and isinstance(version, int) and version < CONTENTS_SINCE:
        return  # the same build in an older summary format: rewritten, nothing is lost
    if not different and proof in (UNRECORDED, OTHER_SUMMARY, OLDER_FORMAT):
        return
    what = "a different build" if different else "a damaged package"
    changed = (_what_changed(existing, layout, identities, recipe, companions or [])
               if different and layout is not None and identities is not None else None)
    raise PackageError(f"output folder already holds {what}; pass --force to replace it",
                       folder=str(target), changed=changed)


def _what_changed(existing: dict[str, Any], layout: Layout,
                  identities: list[dict[str, Any]], recipe: Recipe | None = None,
                  companions: list[Companion] | None = None) -> str:
    """Which inputs of the fingerprint (:func:`_fingerprint`) differ from the build in the
    folder, in words: generator, package and version, the hash algorithm, the layout's
    settings, each model's source, external data and scenarios, the models' order, the
    devices. The summary records scenarios by name and devices by name and chosen
    scenario only: a change it cannot show is named as what it may be."""
    out: list[str] = []
    try:
        before = {m["name"]: m for m in existing.get("models", [])}
        now = {i["name"]: i for i in identities}
        out += [f"model '{n}' added" for n in now if n not in before]
        out += [f"model '{n}' removed" for n in before if n not in now]
        common = [n for n in now if n in before]
        if common != [n for n in before if n in now]:
            out.append("order of the models")
        unsure: list[str] = []
        for name in common:
            ident, old = now[name], before[name]
            if old.get("source_digest") != ident["source_digest"]:
                out.append(f"source of model '{name}'")
            if old.get("external_sources", {}) != ident["external"]:
                out.append(f"external data of model '{name}'")
            if old.get("file") != ident.get("file", f"{name}.onnx"):
                out.append(f"file name of model '{name}'")
            out += _accuracy_changed(existing, name, ident)
            # the summary names the scenarios the recipe defines and those the source
            # holds, without their passes: one named anew is a change, others may be
            defined = {sc["name"] for sc in ident["scenarios"]}
            recorded = set(old.get("scenarios", []))
            if not defined <= recorded:
                out.append(f"scenarios of model '{name}'")
            elif defined or recorded:
                unsure.append(f"scenarios of model '{name}'")
        settings = layout.record()
        old_settings = existing.get("layout", {})
        out += [f"layout {k}" for k in sorted({*settings, *old_settings})
                if old_settings.get(k) != settings.get(k)]
        if recipe is not None:
            for key, value in (("package", recipe.package), ("version", recipe.version),
                               ("hash", recipe.store.hash)):
                if existing.get(key) != value:
                    name = "store.hash" if key == "hash" else key
                    out.append(f"{name} ({existing.get(key)} -> {value})")
        if existing.get("generator") != f"weightstore {__version__}":
            out.append(f"generator ({existing.get('generator')})")
        if recipe is not None:
            out += _devices_changed(existing, layout, recipe, unsure)
        out += _companions_changed(existing, companions or [])
        if not out and unsure:
            return " or ".join(unsure)
    except (AttributeError, TypeError, KeyError):
        pass
    return ", ".join(out) or "scenarios, devices or package settings"


def _accuracy_changed(existing: dict[str, Any], name: str,
                      identity: dict[str, Any]) -> list[str]:
    """The model's samples or its scenarios' bounds changed, as far as the summary's
    ``accuracy`` shows them (it records both for a model with samples and scenarios)."""
    recorded = [a for a in existing.get("accuracy", []) if a.get("model") == name]
    if not recorded and not identity.get("samples"):
        return []
    out = []
    if {a.get("samples") for a in recorded} != {identity.get("samples")}:
        out.append(f"samples of model '{name}'")
    bounds = {sc["name"]: sc.get("bounds") for sc in identity["scenarios"]}
    out += [f"bounds of scenario '{a['scenario']}' of model '{name}'" for a in recorded
            if a.get("scenario") in bounds and a.get("bounds") != bounds[a["scenario"]]]
    return out


def _companions_changed(existing: dict[str, Any], companions: list[Companion]) -> list[str]:
    """Companion files added, removed or changed (bytes or kind) since the summary: the
    package's, then each device's set where it differs otherwise (a pinned file's bytes
    are not known before it is fetched: only its path and kind are compared)."""
    from .companions import device_sets

    out = _set_changed(existing.get("companions", []),
                       [c for c in companions if c.device is None], "")
    recorded = {d.get("name"): d.get("companions", []) for d in existing.get("devices", [])}
    merged = device_sets(companions, recorded)
    for name, before in recorded.items():
        said = {line.split("'")[1] for line in out}
        out += [line for line in _set_changed(before, merged[name], f" of device '{name}'")
                if line.split("'")[1] not in said]
    return out


def _set_changed(before: list[dict[str, Any]], now: list[Companion], of: str) -> list[str]:
    old = {c["path"]: c for c in before}
    new = {c.path: c for c in now}
    out = [f"companion '{p}'{of} added" for p in new if p not in old]
    out += [f"companion '{p}'{of} removed" for p in old if p not in new]
    out += [f"companion '{p}'{of}" for p, c in new.items() if p in old and (
        old[p].get("kind") != c.kind or (c.pin is None and old[p].get("digest") != c.digest))]
    return out


def _devices_changed(existing: dict[str, Any], layout: Layout, recipe: Recipe,
                     unsure: list[str]) -> list[str]:
    """Device changes the summary shows (an embedded layout's, when an earlier version
    wrote it, lists none); the settings it does not record go to ``unsure``."""
    now = [d.name for d in recipe.devices]
    if layout.external_weight == "embedded" and not existing.get("devices"):
        if now:
            unsure.append("devices")
        return []
    recorded = {d["name"]: d for d in existing.get("devices", [])}
    out = [f"device '{n}' added" for n in now if n not in recorded]
    out += [f"device '{n}' removed" for n in recorded if n not in now]
    common = [n for n in now if n in recorded]
    if common != [n for n in recorded if n in now]:
        out.append("order of the devices")
    for device in recipe.devices:
        old = recorded.get(device.name)
        if old is None:
            continue
        if device.scenario != "auto" and device.scenario != old.get("scenario"):
            out.append(f"scenario of device '{device.name}'")
        else:  # the capabilities (which an auto device's choice comes from) are not kept
            unsure.append(f"capabilities of device '{device.name}'")
    return out


__all__ = ["BuildOptions", "BuildResult", "PackageResult", "build"]
