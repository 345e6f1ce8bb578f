"""``weightstore assemble DIR [--output OUT]``: the package, offline, from a folder a
generic client pulled.

A ModelPack or ORAS client (modelpack-client, oras-py) that pulls a weightstore artifact
writes every layer at its file path
(:mod:`.artifact`): the models, ``summary.json``, device records, every per-weight file,
and for combined and split layouts each payload's own file ``payloads/weight_<hex>``.
``summary.json`` says where each payload sits in each weight file, so the package is
rebuilt from the folder alone, byte for byte, by the assembly a pull and a warm build use
(:func:`weightstore.package.assembly.write_files`): every payload's file is checked
against its store key (and its size) before a byte of it is written, each piece is
re-hashed against its key as it is read back, the result is checked against the summary's
``contents`` as a pull checks it, and the folder is written in a temp folder and put in
place in one rename (in place of DIR, without ``--output``). A payload is taken from its
own file, else from a weight file of DIR that holds it (so a folder that already is the
package assembles to itself).

DIR may also be the OCI image layout skopeo writes (``skopeo copy … oci:DIR``: index.json
and blobs/sha256): its files are first laid out beside it, as those clients lay them out,
every blob checked against its sha256 (:mod:`.oci_layout`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, PackageError, WeightstoreError
from ..io.digests import ALGORITHMS, digest_file, digest_file_many, make_key, split_key
from ..io.files import discard_temp_dir, make_temp_dir, name_path, publish_dir
from ..package.assembly import WeightFile, contents_problem, summary_weight_files, write_files
from ..package.summary import SUMMARY_NAME, read_summary_file
from .artifact import list_files, payload_paths


@dataclass
class AssembleReport:
    source: str
    output: str
    files: int = 0  # files of the package written
    weight_files: int = 0  # of which assembled from payloads
    payloads: int = 0  # distinct payloads checked against their keys
    payload_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def contents_algo(summary: Mapping[str, Any]) -> str | None:
    """The algorithm of the summary's file digests (None before ``contents`` existed)."""
    contents = summary.get("contents")
    if not isinstance(contents, list) or not contents or not isinstance(contents[0], dict):
        return None
    algo = str(contents[0].get("digest", "")).partition(":")[0]
    return algo if algo in ALGORITHMS else None


def contents_check(folder: Path, summary: Mapping[str, Any], files: Iterable[WeightFile],
                   known: Mapping[str, str]) -> str | None:
    """Why a folder whose weight files were assembled from ``files`` is not exactly what
    its summary lists (None when it is, or when the summary is from before ``contents``):
    the weight files by construction
    (:func:`~weightstore.package.assembly.contents_problem`), every other file by
    ``known`` (its digest, taken as it was written); nothing unlisted. What ``prepare``
    added is accepted as ``verify`` accepts it."""
    if "contents" not in summary:
        return None  # a package from before file digests: nothing to check against
    from ..resolve.prepared_record import companion_contents

    assembled = {f.name: f for f in files}
    others = {}
    for name in list_files(folder):
        if name not in assembled and name != SUMMARY_NAME:
            others[name] = ((folder / name).stat().st_size, known.get(name, "(not hashed)"))
    try:
        listed = {str(c["path"]) for c in summary["contents"]}
        # what `prepare` added, as verify accepts it: records, and the graphs they name
        records, graphs = companion_contents([n for n in others if n not in listed], folder)
        for name in records:
            others.pop(name)
        for g in graphs:  # small: hashed again when the known digest's algorithm differs
            algo = g["digest"].partition(":")[0]
            if g["path"] in others and not others[g["path"]][1].startswith(f"{algo}:"):
                size = others[g["path"]][0]
                others[g["path"]] = (size, make_key(algo, digest_file(algo,
                                                                      folder / g["path"])))
        return contents_problem(summary, assembled, others,
                                {g["path"]: (g["size"], g["digest"]) for g in graphs})
    except (KeyError, TypeError, ValueError):
        return "the summary's contents are malformed"


def assemble_folder(folder: str | os.PathLike[str], output: str | os.PathLike[str] | None
                    = None, *, jobs: int = 4) -> AssembleReport:
    """Turn ``folder`` (what a generic client pulled) into the package, in ``output`` or,
    without it, in place of ``folder``; see the module docstring. Bad input is a typed
    error naming the file, with nothing written."""
    src = Path(folder)
    if src.is_symlink() or not src.is_dir():
        raise PackageError("not a folder (assemble takes the folder a client pulled)",
                           folder=str(src))
    out = Path(output) if output is not None else src
    if output is not None:
        if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
            raise PackageError("the output folder is the pulled folder or inside it",
                               folder=str(src), output=str(out))
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise PackageError("output folder is not empty", folder=str(out))
    from .oci_layout import is_oci_layout, lay_out

    if not is_oci_layout(src):
        return _assemble(src, out, output is None, jobs)
    files = make_temp_dir(src.parent, f".{src.name}.layout.")
    try:
        lay_out(src, files)
        report = _assemble(files, out, output is None, jobs)
    except WeightstoreError as exc:  # name the layout, not the folder laid out from it
        exc.context = {k: v.replace(str(files), f"{src}[laid out]") if isinstance(v, str)
                       else v for k, v in exc.context.items()}
        raise
    finally:
        discard_temp_dir(files)
    report.source = str(src)
    return report


def _assemble(src: Path, out: Path, replace: bool, jobs: int) -> AssembleReport:
    """Assemble the package from the files in ``src`` into ``out`` (in place of it with
    ``replace``)."""
    _, summary = read_summary_file(src)  # well formed, every path it names inside
    present = set(list_files(src))  # regular files only: a link is refused
    try:
        files = summary_weight_files(summary)
    except (KeyError, TypeError, ValueError):
        raise PackageError("malformed summary.json: its weight files",
                           file=str(src / SUMMARY_NAME)) from None
    sources = _payload_sources(src, files, present)
    report = AssembleReport(str(src), str(out), payloads=len(sources),
                            payload_bytes=sum(size for _, _, size in sources.values()))
    _check_payloads(src, sources, jobs)
    own = {path for paths in payload_paths(files).values() for path in paths}
    weights = {f.name for f in files}
    others = sorted(n for n in present if n not in weights and n not in own)
    algo = contents_algo(summary)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = make_temp_dir(out.parent, f".{out.name}.")
    try:
        known = _copy_files(src, stage, others, algo)
        from ..layout.writer import FileRange

        def locate(key: str) -> FileRange:
            name, offset, _ = sources[key]
            return FileRange(src / name, offset)

        write_files(stage, files, locate, jobs=jobs)
        problem = contents_check(stage, summary, files, known)
        if problem is not None:
            raise IntegrityError("the assembled package does not match its summary; "
                                 "nothing was written", folder=str(src), problem=problem)
        publish_dir(stage, out, replace=replace, over_empty=True)
    except BaseException:
        discard_temp_dir(stage)
        raise
    report.files, report.weight_files = len(others) + len(files), len(files)
    return report


def _payload_sources(src: Path, files: list[WeightFile], present: set[str],
                     ) -> dict[str, tuple[str, int, int]]:
    """Where each payload's bytes are in ``src``: (file, offset, size), its own file
    first (the layer a client wrote), else a weight file holding it."""
    own = payload_paths(files)
    held: dict[str, list[tuple[str, int]]] = {}
    for f in files:
        for p in f.pieces:
            held.setdefault(p.key, []).append((f.name, p.offset))
    sizes = {p.key: p.size for f in files for p in f.pieces}
    out = {}
    for key, paths in own.items():
        found = [(name, 0) for name in paths if name in present]
        found += [(name, offset) for name, offset in held[key] if name in present]
        if not found:
            raise PackageError("a payload's file is missing from the folder; nothing was "
                               "written", file=str(src / paths[0]), key=key)
        name, offset = found[0]
        out[key] = (name, offset, sizes[key])
    return out


def _check_payloads(src: Path, sources: Mapping[str, tuple[str, int, int]],
                    jobs: int) -> None:
    """Every payload's bytes hash to its key (a file too short for it is refused too)."""
    def check(key: str) -> None:
        name, offset, size = sources[key]
        path = src / name
        if path.stat().st_size < offset + size:
            raise IntegrityError("a payload's file is shorter than the payload; nothing "
                                 "was written", file=str(path), key=key, offset=offset,
                                 size=size, file_size=path.stat().st_size)
        algo, hex_ = split_key(key)
        (found,) = digest_file_many((algo,), path, offset, size)
        if found != hex_:
            raise IntegrityError("a payload's file does not match its key; nothing was "
                                 "written", file=str(path), offset=offset, key=key,
                                 actual=make_key(algo, found))

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(check, sorted(sources)))


def _copy_files(src: Path, stage: Path, names: list[str], algo: str | None,
                ) -> dict[str, str]:
    """Copy ``names`` into ``stage``; each copy's ``"<algo>:<hex>"`` when ``algo``."""
    known = {}
    for name in names:
        target = stage / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(src / name, target, follow_symlinks=False)
        except OSError as exc:
            raise name_path(exc, target) from None
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)  # the folder is fsynced once, when it is published
        finally:
            os.close(fd)
        if algo is not None:
            known[name] = make_key(algo, digest_file(algo, target))
    return known
