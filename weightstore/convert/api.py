"""``weightstore convert``: one model in, one model (plus one aligned data file) out."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..catalogue.descriptors import weight_descriptors
from ..catalogue.reader import read_catalogue
from ..catalogue.schema import SMALL_VALUE_LIMIT
from ..errors import ConversionError, WeightstoreError
from ..io.digests import FILE_CHECKSUM, digest_bytes, digest_file
from ..io.files import alignment_problem, check_outputs
from ..io.models import save_model
from ..io.onnx_proto import ModelProto
from ..layout.plan import plan_layout
from ..layout.writer import FileRange, write_plan
from ..progress import Progress
from ..scenarios.api import rebase_scenarios
from ..scenarios.inputs import files_read, scenario_locations
from ..scenarios.storage import read_scenarios
from ..scenarios.variants import metadata_of
from ..store.layout import COMBINED_SUFFIX
from .external_data import declare_file_checksums
from .file_constant import file_constant_locations
from .inline import file_constant_reads, inline_model
from .placement import Placement
from .weights import ModelWeights, Weight


@dataclass(frozen=True)
class ConvertReport:
    """What a conversion wrote: the model file, its data file (None when every weight is
    inline or in FileConstant files beside it), how many tensors went external, how many
    distinct payloads they share and their bytes."""

    output: Path
    data_file: Path | None
    external_tensors: int
    unique_payloads: int
    payload_bytes: int

    def to_dict(self) -> dict[str, object]:
        """What ``convert --json`` prints."""
        return {
            "output": str(self.output),
            "data_file": str(self.data_file) if self.data_file else None,
            "external_tensors": self.external_tensors,
            "unique_payloads": self.unique_payloads,
            "payload_bytes": self.payload_bytes,
        }


def _check_scenarios(model: ModelProto, src: Path, dst: Path, form: str) -> None:
    """Scenarios survive a change of form, not a change of graph or of folder."""
    if not read_scenarios(model):
        return
    if form == "file-constant":
        raise ConversionError("the model has modification scenarios; FileConstant nodes "
                              "would change the graph their records refer to", file=str(src))
    if scenario_locations(model) and dst.resolve().parent != src.resolve().parent:
        raise ConversionError("scenario weights are external files beside the model; "
                              "convert it within its folder", file=str(src))


def convert_to_external(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                        form: str = "external-data", threshold: int = 1024,
                        algo: str = "blake3", alignment: int = 512,
                        jobs: int = 4, progress: bool | None = False) -> ConvertReport:
    """Move payloads of at least ``threshold`` bytes into ``<dst stem>.<tag>_weight_combined``.

    Model and data are one pair, published in two renames. The data file's name carries a
    tag of its content, so it is written under a name no existing model refers to; only
    then does the new model replace ``dst``. A crash in between leaves the old model with
    its old data (plus an unreferenced new file), never the old model reading new bytes.
    The data file the replaced model used is removed last. ``progress``: bars for hashing
    and writing (None: only on an interactive terminal).
    """
    src, dst = Path(src), Path(dst)
    problem = alignment_problem(alignment)
    if problem is not None:  # before the model is read: judged without any work done
        raise ConversionError(problem, alignment=alignment)
    with ModelWeights.open(src, fold=True) as mw:
        source_meta = mw.metadata_model(SMALL_VALUE_LIMIT)
        inputs = files_read(src, source_meta, {d.file for d in mw.descriptors.values()})
        _check_scenarios(source_meta, src, dst, form)
        selected = mw.select(threshold, form)
        with Progress("hashing", sum(w.size for w in selected), enabled=progress) as bar:
            weights = mw.hash(selected, algo, jobs, bar.advance)
        payloads = [(w.key, w.size) for w in weights]
        plan = plan_layout(data_stem(dst.stem, payloads, alignment), payloads, "combined",
                           alignment)
        data_paths = [dst.parent / f.name for f in plan.files]
        check_outputs(src, inputs, [dst, *data_paths])
        replaced = _data_files_of(dst)
        created = [p for p in data_paths if not os.path.lexists(p)]
        by_key: dict[str, Weight] = {}
        for w in weights:
            by_key.setdefault(w.key, w)

        def locate(key: str) -> FileRange | bytes:
            w = by_key[key]
            if w.payload.encoding == "raw":
                return FileRange(w.payload.file, w.payload.offset)
            return mw.read(w)

        try:
            with Progress("writing", sum(f.size for f in plan.files),
                          enabled=progress) as bar:
                write_plan(plan, dst.parent, locate, jobs=jobs, progress=bar.advance)
            where = plan.placement()
            placements = {
                w.site.path: Placement(where[w.key].file, where[w.key].offset, w.size, w.key)
                for w in weights
            }
            model = mw.materialize(placements, form)
            if form == "external-data":  # the pair stands alone: onnx.proto's checksum
                declare_file_checksums(model, {p.name: digest_file(FILE_CHECKSUM, p)
                                               for p in data_paths})
            rebase_scenarios(source_meta, model)
            save_model(model, dst)
        except BaseException:  # no model refers to a data file this run created
            for path in created:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
    data = dst.parent / plan.files[0].name if plan.files else None
    for old in replaced - inputs - ({data.resolve()} if data else set()):
        with contextlib.suppress(OSError):
            old.unlink()
    return ConvertReport(dst, data, len(weights), len(by_key),
                         sum(p.size for p in where.values()))


_PLAIN_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def data_stem(stem: str, payloads: list[tuple[str, int]], alignment: int) -> str:
    """``<name>.<tag>``: the tag digests everything that decides the data file's bytes
    (the unique payloads in order, and the alignment), so equal content gets an equal
    name and different content a different one.

    ``<name>`` is the output's stem when it is a plain file name (letters, digits, ``.``,
    ``_``, ``-``, starting with a letter or digit, at most 100 characters). Any other stem
    (spaces, other scripts, a leading ``_``, a long one) becomes its plain characters, cut
    to 64, then ``.`` and 8 hex digits of the stem itself: two outputs whose stems differ
    never share a data file, so replacing one never removes the other's."""
    unique = list(dict.fromkeys(payloads))
    text = json.dumps([alignment, unique], separators=(",", ":")).encode()
    return f"{_data_name(stem)}.{digest_bytes('blake3', text)[:16]}"


def _data_name(stem: str) -> str:
    if _PLAIN_STEM.fullmatch(stem):
        return stem
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", stem)
    plain = re.sub(r"^[^A-Za-z0-9]+", "", plain)[:64] or "model"
    return f"{plain}.{digest_bytes('blake3', os.fsencode(stem))[:8]}"


def _data_files_of(dst: Path) -> set[Path]:
    """Data files beside ``dst`` that the model now at ``dst`` uses and an earlier
    conversion to ``dst`` wrote (named after its stem); empty when there is none."""
    if not dst.is_file():
        return set()
    ours = re.compile(f"({re.escape(dst.stem)}|{re.escape(_data_name(dst.stem))})"
                      + r"(\.[0-9a-f]{16})?" + re.escape(COMBINED_SUFFIX))
    try:
        with read_catalogue(dst) as catalogue:
            files = {w.payload.file for w in weight_descriptors(catalogue) if w.payload}
            files |= {dst.parent / loc for loc in file_constant_locations(catalogue.model)}
    except (WeightstoreError, OSError, ValueError):
        return set()
    folder = dst.parent.resolve()
    return {f.resolve() for f in files
            if ours.fullmatch(f.name) and f.resolve().parent == folder}


def convert_to_inline(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                      value_bins: Mapping[str, str | os.PathLike[str]] | None = None,
                      progress: bool | None = False) -> ConvertReport:
    """Bring every external payload and FileConstant back into the model, verified.

    FileConstant nodes GE made are resolved as GE does (``location``, then ``file_path``,
    then ``file_id`` through ``value_bins``, GE's ``ge.exec.value_bins``); one that cannot
    be resolved is an error naming it. ``progress``: a bar for the payload bytes read
    (None: only on an interactive terminal).
    """
    src, dst = Path(src), Path(dst)
    bins = {k: Path(v) for k, v in (value_bins or {}).items()}
    with read_catalogue(src) as catalogue:
        external = [w.payload for w in weight_descriptors(catalogue)
                    if w.payload and w.payload.is_external]
        files = {p.file for p in external}
        files |= {src.parent / loc for loc in file_constant_locations(catalogue.model)}
        files |= set(bins.values())
        source_meta = metadata_of(src)
        check_outputs(src, files_read(src, source_meta, files), [dst])
        _check_scenarios(source_meta, src, dst, "inline")
        reads = [(str(p.file), p.offset, p.length) for p in external]
        reads += file_constant_reads(catalogue.model)
        total = sum(length for _, _, length in reads)
        with Progress("reading", total, enabled=progress) as bar:
            model: ModelProto = inline_model(catalogue, value_bins=bins,
                                                  progress=bar.advance)
        rebase_scenarios(source_meta, model)
    save_model(model, dst)
    return ConvertReport(dst, None, len(reads), len(set(reads)), total)


def parse_value_bins(pairs: list[str]) -> dict[str, str]:
    """``["ID=PATH", ...]`` (the ``--value-bins`` option) as a map."""
    out: dict[str, str] = {}
    for pair in pairs:
        file_id, sep, path = pair.partition("=")
        if not sep or not file_id or not path:
            raise ConversionError("--value-bins takes ID=PATH", value=pair)
        if file_id in out:
            raise ConversionError("--value-bins names a file_id twice", file_id=file_id,
                                  paths=f"{out[file_id]}, {path}")
        out[file_id] = path
    return out
