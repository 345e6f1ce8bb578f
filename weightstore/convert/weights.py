"""A catalogued model's weights: which tensors leave the model, their bytes and digests.

This is the bridge between the catalogue (metadata + payload descriptors) and the two output
forms: it selects tensors by size threshold (keeping shape inputs inline), hashes payloads
straight from their byte ranges on a thread pool, and materializes an output model in which
selected tensors point at placements and all others are inline exactly as they were.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..catalogue.metadata import metadata_model
from ..catalogue.payload import (
    PayloadDescriptor,
    describe,
    read_payload,
    verify_file_checksums,
)
from ..catalogue.reader import Catalogue, read_catalogue
from ..catalogue.schema import Path as TensorPath
from ..catalogue.shape_inputs import shape_input_names
from ..catalogue.sites import TensorSite, iter_tensor_sites
from ..errors import ConversionError, IntegrityError, ModelError
from ..io.digests import ALGORITHMS, digest_bytes, digest_file_many, make_key
from ..io.onnx_proto import GraphProto, ModelProto, TensorProto
from .encoding import inline_encoding, set_payload
from .external_data import apply_external_data, recorded_encodings
from .file_constant import apply_file_constant, can_hold
from .placement import ExternalTensor, Placement
from .sources import file_constants_as_external

Form = str  # "external-data" | "file-constant"


def declared_checksum(desc: PayloadDescriptor) -> tuple[str, str] | None:
    """``(algo, hex)`` of the checksum a source declares for a payload, when it is in a
    form we know (``"<algo>:<hex>"``); other tools' forms are left alone."""
    if not desc.checksum:
        return None
    algo, sep, hexdigest = desc.checksum.partition(":")
    return (algo, hexdigest.lower()) if sep and algo in ALGORITHMS else None


def verify_declared(desc: PayloadDescriptor, digests: Mapping[str, str], where: str) -> None:
    """Refuse a payload whose bytes do not match the checksum its source declares.

    ``digests`` maps algorithms to the hex digests of the bytes just read (it must hold
    the declared checksum's algorithm). Every read of a source payload for packaging comes
    through here: the hashing of :meth:`ModelWeights.digest` and the reads of
    :meth:`ModelWeights.read` and :meth:`ModelWeights.materialize` (inline payloads).
    """
    declared = declared_checksum(desc)
    if declared is not None and digests[declared[0]] != declared[1]:
        raise IntegrityError(
            "payload does not match the checksum its model declares",
            tensor=where, location=desc.location, expected=desc.checksum,
            actual=make_key(declared[0], digests[declared[0]]))


@dataclass(frozen=True)
class Weight:
    """One externalizable tensor: its site, where its bytes are, and their digest key."""

    site: TensorSite
    payload: PayloadDescriptor
    key: str = ""

    @property
    def size(self) -> int:
        return self.payload.nbytes


@dataclass
class ModelWeights:
    """Everything needed to write a model in any layout, without holding its payloads."""

    catalogue: Catalogue
    base_dir: Path
    descriptors: dict[TensorPath, PayloadDescriptor]
    sites: list[TensorSite]
    shape_names: frozenset[str]
    keys: dict[TensorPath, str] = field(default_factory=dict)
    encodings: dict[str, str] = field(default_factory=dict)  # external: recorded typed field
    _inputs: dict[int, frozenset[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, fold: bool = False) -> ModelWeights:
        """Catalogue ``path``. ``fold``, for a model about to be written in another form
        or folder: its recorded typed encodings and its FileConstant nodes are folded
        into its tensors (see :mod:`.sources`), so every weight is written or inlined
        and none keeps pointing at a file the output does not hold."""
        catalogue = read_catalogue(path)
        try:
            base_dir = catalogue.source.parent
            encodings: dict[str, str] = {}
            if fold:
                encodings = recorded_encodings(catalogue.model)
                file_constants_as_external(catalogue, base_dir, encodings)
            sites = list(iter_tensor_sites(catalogue.model))
            descriptors = {}
            for site in sites:
                desc = describe(site, catalogue, base_dir)
                if desc is not None:
                    descriptors[site.path] = desc
            verify_file_checksums((descriptors.get(s.path), s.where) for s in sites)
            return cls(catalogue, base_dir, descriptors, sites,
                       shape_input_names(catalogue.model), encodings=encodings)
        except BaseException:
            catalogue.close()
            raise

    def close(self) -> None:
        self.catalogue.close()

    def park(self) -> None:
        """Close the model file, keep everything catalogued (see :meth:`opened`)."""
        self.catalogue.park()

    def opened(self) -> contextlib.AbstractContextManager[Catalogue]:
        """The model file open for a block, if parked; payloads are read only inside."""
        return self.catalogue.opened()

    def __enter__(self) -> ModelWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- selection -------------------------------------------------------------------------

    def _graph_inputs(self, container: object) -> frozenset[str]:
        if not isinstance(container, GraphProto):
            return frozenset()
        key = id(container)
        if key not in self._inputs:
            self._inputs[key] = frozenset(i.name for i in container.input)
        return self._inputs[key]

    def selectable(self, site: TensorSite, form: Form) -> bool:
        """Can this tensor leave the model at all (ignoring its size)?"""
        desc = self.descriptors.get(site.path)
        if desc is None or desc.nbytes == 0 or site.role not in ("initializer", "constant"):
            return False
        if site.tensor.data_type == TensorProto.STRING:
            return False
        if site.value_name and site.value_name in self.shape_names:
            return False
        if (form == "file-constant" and site.role == "initializer"
                and site.tensor.name in self._graph_inputs(site.container)):
            return False  # an initializer doubling as a graph input keeps its slot
        return not (form == "file-constant" and not can_hold(site.tensor))

    def select(self, threshold: int, form: Form) -> list[Weight]:
        """Tensors whose payload is at least ``threshold`` bytes, in structural order."""
        return [
            Weight(site, self.descriptors[site.path], self.keys.get(site.path, ""))
            for site in self.sites
            if self.selectable(site, form) and self.descriptors[site.path].nbytes >= threshold
        ]

    # -- hashing ---------------------------------------------------------------------------

    def hash(self, weights: Iterable[Weight], algo: str, jobs: int = 4,
             progress: Callable[[int], None] | None = None) -> list[Weight]:
        """Digest every payload not digested yet; returns the weights with keys set."""
        todo = [w for w in weights if w.site.path not in self.keys]
        unique: dict[TensorPath, Weight] = {w.site.path: w for w in todo}

        def run(w: Weight) -> tuple[TensorPath, str]:
            hexdigest = self.digest(w, algo)
            if progress is not None:
                progress(w.size)
            return w.site.path, make_key(algo, hexdigest)

        if unique:
            with ThreadPoolExecutor(max(1, jobs)) as pool:
                for path, key in pool.map(run, unique.values()):
                    self.keys[path] = key
        return [Weight(w.site, w.payload, self.keys[w.site.path]) for w in weights]

    def digest(self, weight: Weight, algo: str) -> str:
        """Hex digest of one payload, always computed (never from :attr:`keys`).

        A checksum the source model declares for the payload (external data ``checksum``,
        in a form we know) is verified by the same read: its algorithm, when not ``algo``,
        is fed the same bytes. A mismatch is an error naming the tensor.
        """
        desc = weight.payload
        declared = declared_checksum(desc)
        algos = [algo] if declared is None or declared[0] == algo else [algo, declared[0]]
        if desc.encoding == "raw":  # hashed from the file range, a chunk at a time
            digests = digest_file_many(algos, desc.file, desc.offset, desc.length)
        else:
            data = self._read(desc, weight.site.where)
            digests = [digest_bytes(a, data) for a in algos]
        verify_declared(desc, dict(zip(algos, digests, strict=True)), weight.site.where)
        return digests[0]

    def read(self, weight: Weight) -> bytes:
        """One payload's bytes, checked against the checksum its source declares."""
        return self._checked(weight.payload, weight.site.where)

    def _checked(self, desc: PayloadDescriptor, where: str) -> bytes:
        data = self._read(desc, where)
        declared = declared_checksum(desc)
        if declared is not None:  # the bytes in hand: hashed, never read again
            verify_declared(desc, {declared[0]: digest_bytes(declared[0], data)}, where)
        return data

    def _read(self, desc: PayloadDescriptor, where: str) -> bytes:
        try:
            return read_payload(desc, self.catalogue)
        except ModelError as exc:
            exc.context.setdefault("tensor", where)
            raise

    # -- output ----------------------------------------------------------------------------

    def metadata_model(self, small_limit: int) -> ModelProto:
        """Structure and small values, weights omitted (see :mod:`catalogue.metadata`)."""
        return metadata_model(self.catalogue, small_limit)

    def encoding(self, site: TensorSite, desc: PayloadDescriptor) -> str:
        """The field a tensor's values go back to inline: its own typed field, the one
        recorded for it when it is external, else ``raw_data``."""
        if desc.is_external and desc.encoding == "raw":
            return self.encodings.get(site.key, "raw_data")
        return inline_encoding(site.tensor, desc.encoding if desc.encoding != "raw"
                               else "raw_data")

    def materialize(self, placements: Mapping[TensorPath, Placement], form: Form,
                    ) -> ModelProto:
        """The output model: placed tensors external (in ``form``), all others inline."""
        model = ModelProto()
        model.CopyFrom(self.catalogue.model)
        external: list[ExternalTensor] = []
        for site in iter_tensor_sites(model):
            desc = self.descriptors.get(site.path)
            if desc is None:
                continue
            placement = placements.get(site.path)
            if placement is not None:
                external.append(ExternalTensor(site, placement, self.encoding(site, desc)))
            elif desc.is_external:  # inline in the output: its checksum verified here
                set_payload(site.tensor, self._checked(desc, site.where),
                            self.encoding(site, desc))
            else:
                self.catalogue.restore(site.tensor, site.path, site.where)
        if form == "external-data":
            apply_external_data(model, external)
        elif form == "file-constant":
            apply_file_constant(model, external)
        else:
            raise ConversionError("unknown constants form", form=form)
        return model
