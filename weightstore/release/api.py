"""``weightstore release``: packages -> archives, ``SHA256SUMS`` and ``release.json``.

Release folder (default ``<recipe output>/releases/<package>-<version>/``, or
``releases/<package>-<version>/`` in the current folder for package folders)::

    <package>-<version>-<layout>.tar.zst    one per layout, see :mod:`.archive`
    <package>-<version>-<layout>.report.html  with ``report``: the archive's HTML report
    SHA256SUMS                              ``sha256sum -c SHA256SUMS`` checks them
    release.json                            in-toto Statement, SLSA provenance v1

Every file is written to a temp file, fsynced and renamed. ``--check`` rebuilds everything
from the recipe in a temporary folder with a fresh store and compares byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import os
import queue
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import PackageError
from ..io.digests import digest_file
from ..io.files import (
    atomic_writer,
    discard_temp_dir,
    folder_lock,
    fsync_dir,
    make_temp_dir,
    parse_json,
    read_regular,
    remove_dead_temp_dirs,
)
from ..io.workers import default_jobs
from ..package.summary import SUMMARY_NAME
from ..packaging.companion_files import companion_files
from ..packaging.inventory import read_summary_bytes, verified_package
from ..packaging.unpack import SUFFIX, archive_root
from .archive import ARCHIVE_FORMAT, plan_archive, source_date_epoch, write_archive
from .attestation import ATTESTATION_NAME
from .compression import Compression
from .provenance import (
    PROVENANCE_NAME,
    SUMS_NAME,
    ArchiveRecord,
    FileRecord,
    render_statement,
    render_sums,
    statement,
    tool_versions,
)
from .stage import Stage

if TYPE_CHECKING:
    from ..recipe.schema import LoadedRecipe

RELEASES_DIR = "releases"
TEMP_PREFIX = ".release."  # the temp folder a release is made in, beside its files
# Compressed chunks of 128 KiB (about zstd's own ZSTD_CStreamOutSize): with 256 KiB or
# 4 MiB chunks, write() alone took 1.3 to 1.9 s of CPU per GB against 0.4 s (measured, not
# explained: likely the chunk is no longer in cache when it is written)
CHUNK = 128 << 10
QUEUED_CHUNKS = 32  # waiting for each of the two stages (4 MiB)
BUFFERS = QUEUED_CHUNKS + 2  # output buffers: queued, being written, being filled
WRITEBACK_STEP = 64 << 20  # bytes written between two writeback requests


@dataclass(frozen=True)
class ReleaseOptions:
    output: str | None = None
    # recipes: the build's store; package folders: the store whose record of the build
    # they must match (both default to $WEIGHTSTORE_DIR or the user cache folder)
    store: str | None = None
    jobs: int = default_jobs()  # zstd workers (the bytes do not depend on it)
    compression: Compression = field(default_factory=Compression)
    epoch: int | None = None  # None: SOURCE_DATE_EPOCH, else a fixed epoch
    progress: bool | None = False  # bars with rate and ETA (None: only on a terminal)
    report: bool = False  # also each archive's HTML report (weightstore report)
    # sign release.json into release.intoto.jsonl (a weightstore.signing.keys.PrivateKey)
    signer: Any = None
    force: bool = False  # replace a release of another date (SOURCE_DATE_EPOCH) in output
    # the archives' member order (.archive); an older one only to check a release made so
    archive_format: int = ARCHIVE_FORMAT


@dataclass
class ReleaseResult:
    output: Path
    archives: list[ArchiveRecord]
    built: list[str] = field(default_factory=list)  # layouts the build had to (re)build
    reports: list[FileRecord] = field(default_factory=list)
    signed_by: str = ""  # the public key of the attestation's signature, when signed

    def to_dict(self) -> dict[str, Any]:
        return {"output": str(self.output), "built": self.built,
                "archives": [dataclasses.asdict(a) for a in self.archives],
                "reports": [dataclasses.asdict(r) for r in self.reports],
                "signed_by": self.signed_by or None,
                "files": [a.file_name for a in self.archives]
                + [r.file_name for r in self.reports] + [SUMS_NAME, PROVENANCE_NAME]
                + ([ATTESTATION_NAME] if self.signed_by else [])}


@dataclass(frozen=True)
class _Package:
    folder: Path
    summary_bytes: bytes
    summary: dict[str, Any]
    unproven_by: Path | None = None  # a store that does not know the build (proof.py)


def release(target: str | os.PathLike[str], options: ReleaseOptions | None = None,
            ) -> ReleaseResult:
    """Release a recipe (built first; up-to-date packages are reused) or package folders
    (one layout's folder, or a version folder holding several)."""
    options = options or ReleaseOptions()
    path = Path(target)
    if path.is_file():
        from ..recipe.schema import load_recipe

        return _release_recipe(load_recipe(path), options)
    from ..packaging.proof import proving_store

    store = proving_store(options.store)
    packages = [_read_package(p, store) for p in _package_folders(path)]
    first = packages[0].summary
    output = Path(options.output or Path(RELEASES_DIR) / f"{first['package']}-"
                                                        f"{first['version']}")
    return _write_release(packages, output, options, recipe=None)


def _release_recipe(loaded: LoadedRecipe, options: ReleaseOptions) -> ReleaseResult:
    from ..builder.run import BuildOptions, build

    result = build(loaded, BuildOptions(store=options.store, jobs=options.jobs,
                                        progress=options.progress))
    recipe = loaded.recipe
    output = Path(options.output or loaded.output_dir() / RELEASES_DIR
                  / f"{recipe.package}-{recipe.version}")
    packages = [_read_package(p.path, result.store) for p in result.packages]
    recipe_id = (loaded.path.name, hashlib.sha256(loaded.path.read_bytes()).hexdigest())
    out = _write_release(packages, output, options, recipe=recipe_id)
    out.built = [p.layout for p in result.packages if p.status == "built"]
    return out


def _package_folders(path: Path) -> list[Path]:
    if (path / SUMMARY_NAME).is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if (p / SUMMARY_NAME).is_file())
        if found:
            return found
    if not path.exists():
        raise PackageError("no such recipe or package folder", path=str(path))
    raise PackageError("not a recipe, a package folder, or a folder of package layouts",
                       path=str(path))


def _read_package(folder: Path, store: Path) -> _Package:
    """The package at ``folder``, refused when ``store`` recorded its build with another
    summary (:mod:`weightstore.packaging.proof`); its files are checked against the summary
    before anything is written (their kinds, sizes and list, as ``verify`` checks them) and
    their digests as they are archived."""
    from ..packaging.proof import PROVEN_INTERNAL, check_recorded_build

    data, summary = read_summary_bytes(folder)
    proven = check_recorded_build(folder, store, data, summary)
    return _Package(folder, data, summary, store if proven == PROVEN_INTERNAL else None)


def _write_release(packages: Sequence[_Package], output: Path, options: ReleaseOptions,
                   recipe: tuple[str, str] | None) -> ReleaseResult:
    identity = {(p.summary["package"], p.summary["version"]) for p in packages}
    if len(identity) != 1:
        raise PackageError("a release holds one package version; these folders hold "
                           f"{len(identity)}", folders=", ".join(str(p.folder) for p in packages))
    epoch = source_date_epoch() if options.epoch is None else options.epoch
    if output.is_dir():  # a killed release's temp folder goes, whatever happens next
        remove_dead_temp_dirs(output, TEMP_PREFIX)
        _refuse_another_date(output, epoch, options.force)
    for p in packages:  # what verify refuses, before a byte is read (a FIFO never opened)
        verified_package(p.folder, hashed=False)  # the digests: while archiving
    made = not output.exists()
    output.mkdir(parents=True, exist_ok=True)
    # every file is made in a temp folder first: a failed release leaves the previous one
    # whole, never new archives beside old checksums (and a killed one's temp folder is
    # removed by the next release into the folder)
    tmp: Path | None = None
    done = False
    try:
        tmp = make_temp_dir(output, TEMP_PREFIX)
        records = [_write_archive(p, tmp, epoch, options) for p in packages]
        reports = [_write_report(p, r, tmp) for p, r in zip(packages, records, strict=True)
                   ] if options.report else []
        package, version = identity.pop()
        doc = statement(package=package, version=version, archives=records,
                        summaries=[p.summary for p in packages], epoch=epoch,
                        compression=options.compression.to_dict(), recipe=recipe,
                        versions=tool_versions(), reports=reports if options.report else None,
                        archive_format=options.archive_format)
        with atomic_writer(tmp / SUMS_NAME) as f:
            f.write(render_sums([*records, *reports]))
        provenance = render_statement(doc)
        with atomic_writer(tmp / PROVENANCE_NAME) as f:
            f.write(provenance)
        names = [*(r.file_name for r in records), *(r.file_name for r in reports),
                 SUMS_NAME, PROVENANCE_NAME]
        if options.signer is not None:
            from .attestation import attestation

            with atomic_writer(tmp / ATTESTATION_NAME) as f:
                f.write(attestation(provenance, options.signer))
            names.append(ATTESTATION_NAME)
        with folder_lock(output):  # of two releases into one folder, one whole set wins
            _refuse_another_date(output, epoch, options.force)  # one made meanwhile
            for name in names:
                os.replace(tmp / name, output / name)
            if options.signer is None:  # an earlier release's signature signs no more
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(output / ATTESTATION_NAME)
            fsync_dir(output)
        done = True
    finally:
        discard_temp_dir(tmp)
        if made and not done:  # the folder this release made: nothing is left behind
            with contextlib.suppress(OSError):
                output.rmdir()
    from ..packaging.proof import say_unproven

    for p in packages:  # archived, so checked against their summaries
        if p.unproven_by is not None:
            say_unproven(p.folder, p.unproven_by)
    return ReleaseResult(output, records, reports=reports, signed_by="" if options.signer
                         is None else options.signer.public.text)


def report_name(archive_name: str) -> str:
    """The report of ``<package>-<version>-<layout>.tar.zst``: ``….report.html``."""
    return archive_name.removesuffix(SUFFIX) + ".report.html"


def _write_report(p: _Package, archive: ArchiveRecord, folder: Path) -> FileRecord:
    """The page ``weightstore report ARCHIVE`` writes of the archive just made, rendered
    from the folder it was made of (whose files were checked against the summary on their
    way into it), so the archive is not read back."""
    from ..report.data import collect_report
    from ..report.page import render_page

    data = collect_report(p.folder, named=("archive", archive.file_name))
    page = render_page(data).encode()
    name = report_name(archive.file_name)
    with atomic_writer(folder / name) as f:
        f.write(page)
    return FileRecord(name, hashlib.sha256(page).hexdigest())


def _write_archive(p: _Package, folder: Path, epoch: int, options: ReleaseOptions,
                   ) -> ArchiveRecord:
    from ..progress import Progress

    plan = plan_archive(p.summary, len(p.summary_bytes), epoch, options.archive_format)
    total = sum(e.size for e in plan.entries if not e.is_dir and e.source != SUMMARY_NAME)
    with (atomic_writer(folder / plan.file_name) as f,
          Progress(f"archiving {p.summary['layout']['name']}", total,
                   enabled=options.progress) as bar):
        sink = _ArchiveFile(f)
        try:
            companions = write_archive(plan, p.folder, p.summary_bytes, sink,
                                       options.compression, options.jobs, bar.advance,
                                       sha256_of={c.file for c in companion_files(p.summary)})
        finally:
            sha256 = sink.close()
    return ArchiveRecord(plan.file_name, p.summary["layout"]["name"], sha256, sink.size,
                         p.summary["fingerprint"], tuple(sorted(companions.items())))


class _ArchiveFile:
    """The compressor's output sink: the archive's sha256 and its writing to the file, each
    in a :class:`Stage` of its own, so that neither waits for the other (each costs about
    what one zstd worker does).

    Output buffers come from a fixed pool and go back to it once both stages are done with
    them, so memory stays at ``BUFFERS`` chunks and no chunk is copied on its way to the
    file. Written ranges are handed to the kernel for writeback as they accumulate
    (``posix_fadvise``), so the final fsync waits only for the last ones.
    """

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._h = hashlib.sha256()
        self._written = self._synced = 0
        self._free: queue.LifoQueue[bytearray] = queue.LifoQueue()  # warmest first
        self._made = 0
        self._users: dict[int, int] = {}  # id(buffer) -> stages still using it
        self._lock = threading.Lock()
        self._stages: list[Stage[tuple[bytearray, int]]] = [
            Stage(self._hash, "release-sha256", QUEUED_CHUNKS, done=self._release),
            Stage(self._write, "release-writer", QUEUED_CHUNKS, done=self._release)]
        self.size = 0

    def _hash(self, item: tuple[bytearray, int]) -> None:
        self._h.update(memoryview(item[0])[:item[1]])

    def _write(self, item: tuple[bytearray, int]) -> None:
        buffer, n = item
        self._f.write(memoryview(buffer)[:n])
        self._written += n
        if self._written - self._synced >= WRITEBACK_STEP and hasattr(os, "posix_fadvise"):
            self._f.flush()
            os.posix_fadvise(self._f.fileno(), self._synced, self._written - self._synced,
                             os.POSIX_FADV_DONTNEED)
            self._synced = self._written

    def _release(self, item: tuple[bytearray, int]) -> None:
        with self._lock:
            self._users[id(item[0])] -= 1
            if self._users[id(item[0])]:
                return
            del self._users[id(item[0])]
        self._free.put(item[0])

    def buffer(self) -> bytearray:
        if self._made < BUFFERS:
            try:
                return self._free.get_nowait()
            except queue.Empty:
                self._made += 1
                return bytearray(CHUNK)
        return self._free.get()

    def submit(self, buffer: bytearray, size: int) -> None:
        with self._lock:
            self._users[id(buffer)] = len(self._stages)
        for stage in self._stages:
            stage.put((buffer, size))
        self.size += size

    def close(self) -> str:
        """Wait for every queued chunk; the sha256 hex digest of all of them."""
        errors = []
        for stage in self._stages:
            try:
                stage.close()
            except BaseException as exc:  # the other stage is still waited for
                errors.append(exc)
        if errors:
            raise errors[0]
        return self._h.hexdigest()


@dataclass
class CheckResult:
    output: Path
    compared: list[str]
    difference: str | None = None

    @property
    def ok(self) -> bool:
        return self.difference is None

    def to_dict(self) -> dict[str, Any]:
        return {"output": str(self.output), "compared": self.compared, "ok": self.ok,
                "difference": self.difference}


def check_release(recipe_path: str | os.PathLike[str], options: ReleaseOptions | None = None,
                  ) -> CheckResult:
    """Rebuild the release from scratch (temp folder, fresh store) and compare it byte for
    byte with the one in the output folder, as ``nix build --check`` does."""
    from ..recipe.schema import load_recipe

    options = options or ReleaseOptions()
    path = Path(recipe_path)
    if not path.is_file():
        raise PackageError("release --check needs the recipe: it rebuilds from the sources",
                           path=str(path))
    loaded = load_recipe(path)
    recipe = loaded.recipe
    existing = Path(options.output or loaded.output_dir() / RELEASES_DIR
                    / f"{recipe.package}-{recipe.version}")
    if not (existing / SUMS_NAME).is_file():
        raise PackageError("no release to check; run weightstore release first",
                           folder=str(existing))
    options = _published_settings(existing, options)
    archives = [archive_root({"package": recipe.package, "version": recipe.version,
                              "layout": {"name": layout.name}}) + SUFFIX
                for layout in recipe.layouts]
    _refuse_unwritten(existing, [*archives, *(report_name(a) for a in archives
                                              if options.report)])
    with tempfile.TemporaryDirectory(prefix="weightstore-check-") as tmp:
        fresh = dataclasses.replace(loaded, recipe=recipe.model_copy(
            update={"output": str(Path(tmp) / "out")}))
        rebuilt = _release_recipe(fresh, dataclasses.replace(
            options, store=str(Path(tmp) / "store"), output=str(Path(tmp) / "release")))
        names = [a.file_name for a in sorted(rebuilt.archives, key=lambda a: a.file_name)]
        names += sorted(r.file_name for r in rebuilt.reports)
        names += [SUMS_NAME, PROVENANCE_NAME]
        for name in names:
            difference = _first_difference(existing / name, rebuilt.output / name)
            if difference is not None:
                return CheckResult(existing, names, f"{name}: {difference}")
    return CheckResult(existing, names)


def _refuse_unwritten(folder: Path, archives: Sequence[str]) -> None:
    """A release folder holds only what release writes there: the recipe's archives,
    ``SHA256SUMS``, ``release.json``, a signed release's ``release.intoto.jsonl`` (and the
    temp folder of a live release, as
    :func:`~weightstore.io.files.make_temp_dir` makes it; a killed release's is removed
    first, as the next release removes it, whatever it holds). Any other file or folder
    beside them (an archive of no layout, a note, a file or a link or a folder only named
    like a temp folder) is named, since a release that passes its check must be exactly
    what the recipe gives."""
    from ..io.files import is_temp_dir

    remove_dead_temp_dirs(folder, TEMP_PREFIX)
    written = {*archives, SUMS_NAME, PROVENANCE_NAME, ATTESTATION_NAME}
    extra = sorted(name for name in os.listdir(folder) if name not in written
                   and not is_temp_dir(folder / name, TEMP_PREFIX))
    if extra:
        raise PackageError("the release folder holds files release does not write; "
                           "move them out to check it", folder=str(folder),
                           files=", ".join(extra))


def _published_parameters(folder: Path, kind: str = "externalParameters") -> Any:
    """The external (or internal) parameters of the release.json in ``folder`` (None when
    it has none)."""
    try:
        return parse_json(read_regular(folder / PROVENANCE_NAME))[
            "predicate"]["buildDefinition"][kind]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _refuse_another_date(folder: Path, epoch: int, force: bool) -> None:
    """A release in ``folder`` made with another ``SOURCE_DATE_EPOCH`` is replaced only
    with ``force``: a release of a commit's date is not silently swapped for one of
    another date (a later command without the variable would write 1980-dated archives)."""
    params = _published_parameters(folder)
    published = params.get("source_date_epoch") if isinstance(params, dict) else None
    if force or not isinstance(published, int) or published == epoch:
        return

    def dated(value: int) -> str:
        when = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
        return f"{value} ({when.strftime('%Y-%m-%dT%H:%M:%SZ')})"

    raise PackageError("the release folder holds a release of another date; set "
                       "SOURCE_DATE_EPOCH to its date, or pass --force to replace it",
                       folder=str(folder), published_epoch=dated(published),
                       this_epoch=dated(epoch))


def _published_settings(folder: Path, options: ReleaseOptions) -> ReleaseOptions:
    """The epoch, compression, reports and archive format the published release was made
    with (from its release.json), so that the check asks whether the sources give these
    bytes."""
    params = _published_parameters(folder)
    internal = _published_parameters(folder, "internalParameters")
    try:
        compression = Compression(int(params["compression"]["level"]),
                                  bool(params["compression"]["long_distance"]))
        epoch = int(params["source_date_epoch"])
        report = params.get("report") is True
        # not recorded: format 1, or archives without companions (the same in every format)
        archive_format = internal.get("archive_format", 1)
    except (ValueError, KeyError, TypeError, AttributeError):
        return options  # unreadable: the comparison will name release.json
    if type(archive_format) is not int or not 1 <= archive_format <= ARCHIVE_FORMAT:
        raise PackageError("the release's archive format is not one this version writes",
                           folder=str(folder), archive_format=archive_format,
                           known=f"1 to {ARCHIVE_FORMAT}")
    return dataclasses.replace(options, compression=compression, report=report,
                               epoch=options.epoch if options.epoch is not None else epoch,
                               archive_format=archive_format)


def _first_difference(published: Path, rebuilt: Path) -> str | None:
    if not published.is_file():
        return "missing from the published release"
    if published.stat().st_size == rebuilt.stat().st_size and (
            digest_file("blake3", published) == digest_file("blake3", rebuilt)):
        return None
    if published.name.endswith(".tar.zst"):
        from ..packaging.diff import first_member_difference

        return first_member_difference(published, rebuilt)
    with open(published, "rb") as a, open(rebuilt, "rb") as b:
        offset = 0
        while True:
            x, y = a.read(1 << 16), b.read(1 << 16)
            if x != y:
                same = (p == q for p, q in zip(x, y, strict=False))
                i = next((k for k, eq in enumerate(same) if not eq), min(len(x), len(y)))
                return f"bytes differ from offset {offset + i}"
            if not x:
                return None
            offset += len(x)
