"""A variant's self-contained folder: its models, and weight files holding only its live
payloads.

``weightstore bundle`` and ``pull --device`` / ``--scenario`` both make such a folder.
Its weight files keep the package's names, but each holds only the payloads the folder's
models read, laid out again in offset order at the layout's alignment
(:func:`weightstore.layout.plan.plan_live`), so the folder carries its live bytes and
their padding, not the package's shared files whole; the models' external data (and
FileConstant nodes) point at the new offsets, and the folder's ``bundle.json`` lists the
new files and each live payload's key at its new place. The same models and alignment
always give the same folder, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalogue.payload import external_entries
from ..catalogue.sites import iter_tensor_sites
from ..errors import PackageError
from ..io.digests import digest_file, make_key
from ..io.models import save_model
from ..io.onnx_proto import ModelProto, TensorProto, make_attribute
from ..package.assembly import Piece, WeightFile, plan_live
from ..package.bundle_record import model_entry
from ..scenarios.resolve import live_payloads


@dataclass(frozen=True)
class VariantModel:
    """One model of the folder: its name, file, final graph (a resolved variant, external
    data at the package's offsets), the scenario it runs and the store keys of its
    payloads by package location and offset."""

    name: str | None
    file: str
    model: ModelProto
    scenario: str | None
    keys: Mapping[tuple[str, int], str]


@dataclass(frozen=True)
class VariantFiles:
    """What :func:`write_models` wrote and what is left to write: the models' bundle
    entries, the weight files (pieces at their new offsets, every key once) and, per key,
    where the payload is in the package (location, offset)."""

    entries: list[dict[str, Any]]
    files: list[WeightFile]
    sources: dict[str, tuple[str, int]]

    @property
    def live(self) -> dict[str, int]:
        """Every live payload's key and size."""
        return {p.key: p.size for f in self.files for p in f.pieces}


def write_models(folder: Path, models: Sequence[VariantModel], alignment: int,
                 algo: str) -> VariantFiles:
    """Write each model into ``folder``, its live payloads moved to their places in the
    folder's weight files; returns its bundle entries (each model file's digest in
    ``algo``) and the weight files to write."""
    found = [(m, live_payloads(m.model, m.scenario)) for m in models]
    sizes, moved = plan_live(((p.location, p.offset, p.length) for _, live in found
                              for p in live), alignment)
    pieces: dict[str, set[Piece]] = {name: set() for name in sizes}
    sources: dict[str, tuple[str, int]] = {}
    entries = []
    for m, live in found:
        keys = {}
        for p in live:
            key = m.keys.get((p.location, p.offset)) or p.checksum
            if key is None:
                raise PackageError("a live weight of a device model has no store key",
                                   model=m.file, weight=p.name, location=p.location,
                                   offset=p.offset)
            new = moved[(p.location, p.offset)]
            keys[(p.location, new)] = key
            pieces[p.location].add(Piece(key, new, p.length))
            sources.setdefault(key, (p.location, p.offset))
        model = ModelProto()
        model.CopyFrom(m.model)
        relocate(model, moved)
        path = folder / m.file
        path.parent.mkdir(parents=True, exist_ok=True)
        size = save_model(model, path)
        entries.append(model_entry(m.name, m.file, m.scenario, size,
                                   live_payloads(model, m.scenario), keys,
                                   make_key(algo, digest_file(algo, path))))
    files = [WeightFile(name, sizes[name], tuple(sorted(pieces[name],
                                                        key=lambda p: (p.offset, p.key))))
             for name in sorted(sizes)]
    return VariantFiles(entries, files, sources)


def relocate(model: ModelProto, moved: Mapping[tuple[str, int], int]) -> None:
    """Point ``model``'s external tensors and FileConstant nodes at the new offsets
    ``moved`` gives their ranges (by location and old offset). A whole-file SHA-1 an
    external tensor declares is dropped: it was the package file's."""
    for site in iter_tensor_sites(model):
        t = site.tensor
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = external_entries(t, site.where)
        offset = moved[(info.location, info.offset)]
        if info.file_sha1:
            kept = [(e.key, e.value) for e in t.external_data if e.key != "checksum"]
            del t.external_data[:]
            for key, value in kept:
                t.external_data.add(key=key, value=value)
        entry = next((e for e in t.external_data if e.key == "offset"), None)
        if entry is not None:
            entry.value = str(offset)
        elif offset:
            t.external_data.add(key="offset", value=str(offset))
    _relocate_file_constants(model, moved)


def _relocate_file_constants(model: ModelProto,
                             moved: Mapping[tuple[str, int], int]) -> None:
    from ..catalogue.graphs import iter_scoped_containers
    from ..convert.file_constant import (
        attribute_text,
        file_constant_attributes,
        is_file_constant,
    )

    for container, _, _ in iter_scoped_containers(model):
        for node in container.node:
            if not is_file_constant(node):
                continue
            attrs = file_constant_attributes(node)
            location = attribute_text(attrs.get("location", b""))
            offset = int(attrs.get("offset", 0))
            new = moved.get((location, offset))
            if new is None:
                continue  # not live: resolution keeps no such node
            for a in node.attribute:
                if a.name == "offset":
                    a.i = new
                    break
            else:
                if new:
                    node.attribute.append(make_attribute("offset", new))
