"""One model file opened for resolution, parsed once.

A model whose inline payloads are all small (a packaged one) is its own metadata model and
is parsed whole by protobuf; only when a phase needs the byte range of an omitted inline
payload, or the file holds large ones, is it read through the wire-level catalogue
(structure read, payloads located, none read).

A source rebuilt from a cached resolution (:mod:`.cache`) has not opened its file: it
opens it when something asks for its metadata or catalogue, and refuses a file whose
stamp is not the one resolved. So this module imports neither onnx nor the catalogue
until a file is parsed: a cached resolution costs neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelError
from ..io.files import read_exact
from ..io.identity import file_stamp

if TYPE_CHECKING:
    import onnx

    from ..catalogue.reader import Catalogue


def _check_digest(digest: str, path: Path, *, fd: int | None = None,
                  data: bytes | None = None) -> None:
    """Refuse the model file whose bytes (``data``, the very bytes parsed, else read
    through ``fd``) do not have ``digest``."""
    from ..errors import IntegrityError
    from ..io.digests import digest_bytes, digest_fd, split_key

    algo, expected = split_key(digest)
    actual = (digest_bytes(algo, data) if data is not None else
              digest_fd(algo, fd, 0, os.fstat(fd).st_size, name=str(path)))  # type: ignore[arg-type]
    if actual != expected:
        raise IntegrityError("the model file does not match its digest in its package "
                             "record", file=str(path), expected=digest,
                             actual=f"{algo}:{actual}")


@dataclass
class ModelSource:
    """One model file opened for resolution; owned by the ResolvedModel made from it.

    The file stays open from :func:`open_source` to :meth:`close`, so the catalogue,
    when a phase asks for it, describes the very file the metadata was parsed from.
    """

    path: Path  # the model file
    name: str
    package: Path | None = None
    # each live external weight's store key by (location, offset), from the model's
    # record (package summary or bundle record); None when the model has no record
    store_keys: dict[tuple[str, int], str] | None = None
    device_scenario: str | None = None
    device_capabilities: dict[str, Any] = field(default_factory=dict)
    store: Any = None  # a locator.StoreLocator, when a store is known
    in_store: bool = False  # opened from a store reference: no folder holds its weights
    # what the model's package record gives its bytes (``"algo:hex"``): checked on the
    # very bytes parsed, each time the file is opened (see :meth:`_parse`)
    digest: str | None = None
    _fd: int | None = field(default=None, repr=False)
    _catalogue: Catalogue | None = field(default=None, repr=False)
    _metadata: onnx.ModelProto | None = field(default=None, repr=False)
    _stamp: tuple[int, ...] = field(default=(), repr=False)  # the file the metadata is of
    _unopened: bool = field(default=False, repr=False)  # see :meth:`unopened`

    @classmethod
    def open(cls, path: Path, name: str, *, fd: int | None = None,
             digest: str | None = None, **kwargs: Any) -> ModelSource:
        """Open and parse the model file (a malformed one fails here, naming the file);
        ``fd``: the file already open (the source owns it from here on); ``digest``
        (``"algo:hex"``): what its package records of its bytes, checked here through the
        same descriptor (an :class:`~weightstore.errors.IntegrityError` if they differ)."""
        from ..catalogue.reader import open_model
        from ..catalogue.sites import name_attribute_tensors

        source = cls(path, name, _fd=open_model(path) if fd is None else fd, digest=digest,
                     **kwargs)
        try:
            source._metadata = name_attribute_tensors(source._parse())
        except BaseException:
            source.close()
            raise
        return source

    @property
    def folder(self) -> Path | None:
        """Where external weight files are looked for first; None for a build opened from
        the store (its model file sits among store objects, not in a package)."""
        return None if self.in_store else self.path.parent

    @property
    def catalogue(self) -> Catalogue:
        """The file's catalogue (payload byte ranges), walked on first use."""
        self._reopen()
        if self._catalogue is None:
            from ..catalogue.reader import catalogue_from
            from ..catalogue.sites import name_attribute_tensors

            if self._fd is None:
                raise ModelError("model source is closed", file=str(self.path))
            if file_stamp(os.fstat(self._fd)) != self._stamp:
                raise ModelError("model file changed since it was parsed",
                                 file=str(self.path))
            fd, self._fd = self._fd, None
            self._catalogue = catalogue_from(fd, self.path)  # owns the descriptor now
            name_attribute_tensors(self._catalogue.model)  # as the metadata has them
        return self._catalogue

    def metadata(self) -> onnx.ModelProto:
        """Structure and small values; large payloads omitted, external files unopened.

        Parsed once, when the source was opened; each call returns a copy the caller may
        transform.
        """
        from ..io.onnx_proto import ModelProto

        self._reopen()
        if self._metadata is None:  # a rebuilt source closed before it was opened
            raise ModelError("model source is closed", file=str(self.path))
        out = ModelProto()
        out.CopyFrom(self._metadata)
        return out

    def _parse(self) -> onnx.ModelProto:
        from ..catalogue.metadata import WHOLE_PARSE_LIMIT, metadata_model, parse_metadata

        if self._catalogue is None and self._fd is not None:
            st = os.fstat(self._fd)
            self._stamp, size = file_stamp(st), st.st_size
            data = None
            if 0 < size <= WHOLE_PARSE_LIMIT:
                try:
                    data = read_exact(self._fd, 0, size)
                except (EOFError, OSError):
                    data = None  # the catalogue names the problem
            if self.digest is not None and size:
                # the very bytes parsed; a large file is parsed through the catalogue,
                # whose payloads are each verified against their own digest when read
                _check_digest(self.digest, self.path, data=data, fd=self._fd)
            model = None if data is None else parse_metadata(data, self.path)
            if model is not None:
                return model
        return metadata_model(self.catalogue)

    @classmethod
    def unopened(cls, path: Path, name: str, stamp: tuple[int, ...],
                 **kwargs: Any) -> ModelSource:
        """The source of a cached resolution: the file at ``path``, whose stamp was
        ``stamp`` when it was resolved, opened only when its metadata is asked for."""
        return cls(path, name, _stamp=tuple(stamp), _unopened=True, **kwargs)

    def _reopen(self) -> None:
        if not self._unopened:
            return
        from ..catalogue.reader import open_model
        from ..catalogue.sites import name_attribute_tensors

        self._unopened = False
        stamp, self._stamp = self._stamp, ()
        self._fd = open_model(self.path)
        if file_stamp(os.fstat(self._fd)) != stamp:
            self.close()
            raise ModelError("model file changed since it was resolved", file=str(self.path))
        self._metadata = name_attribute_tensors(self._parse())

    def close(self) -> None:
        self._unopened = False
        if self._catalogue is not None:
            self._catalogue.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def closed(self) -> bool:
        """Is the model file closed (the source's and its catalogue's descriptor alike)?"""
        return not self._unopened and self._fd is None and (
            self._catalogue is None or self._catalogue._fd is None)
