"""zstd through libzstd's own streaming API (the cffi build that python-zstandard ships).

Release archives are written (:mod:`weightstore.release.zstd_frame`) and read here.
python-zstandard's ``stream_reader`` ends quietly where its input ends, even inside a
frame: an archive missing its last bytes (the frame's checksum, or whole blocks) read as a
shorter, complete one. :class:`FrameReader` drives ``ZSTD_decompressStream`` itself and
knows from its answer whether the input stopped at the end of a frame; anything else is a
:class:`CorruptStream`. Memory stays bounded: output goes into the caller's buffer, and a
frame may not ask for a window over :data:`WINDOW_LOG_MAX`.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO

from ..errors import PackageError

INPUT_CHUNK = 128 << 10  # compressed bytes read at a time (about ZSTD_DStreamInSize)
WINDOW_LOG_MAX = 27  # 128 MiB: the largest window release writes (--long), zstd's default


class CorruptStream(ValueError):
    """The compressed stream is damaged or ends inside a frame."""


def zstd_lib() -> tuple[Any, Any]:
    """python-zstandard's cffi ``(ffi, lib)``, whose ``lib`` has libzstd's whole API."""
    try:
        from zstandard.backend_cffi import ffi, lib
    except ImportError as exc:  # a zstandard built without its cffi module
        raise PackageError("zstd: this zstandard installation lacks its cffi backend "
                           "(install zstandard's wheel, with cffi)",
                           detail=str(exc)) from None
    return ffi, lib


class FrameReader(io.RawIOBase):
    """The decompressed bytes of ``source``: one or more whole zstd frames, each one's
    checksum checked at its end. Reaching the end of ``source`` inside a frame raises
    :class:`CorruptStream`, as does any damage libzstd finds."""

    def __init__(self, source: BinaryIO) -> None:
        super().__init__()
        ffi, lib = self._ffi, self._lib = zstd_lib()
        dctx = lib.ZSTD_createDCtx()
        if dctx == ffi.NULL:
            raise MemoryError("zstd: cannot allocate a decompression context")
        self._dctx = ffi.gc(dctx, lib.ZSTD_freeDCtx)
        self._check(lib.ZSTD_DCtx_setParameter(self._dctx, lib.ZSTD_d_windowLogMax,
                                               WINDOW_LOG_MAX))
        self._source = source
        self._in = ffi.new("ZSTD_inBuffer *")
        self._out = ffi.new("ZSTD_outBuffer *")
        self._input: Any = None  # keeps the cdata of the current input chunk alive
        self._drained = False  # the source has no more bytes
        self._inside = False  # libzstd is inside a frame: more input or output is due

    def _check(self, code: int) -> int:
        if self._lib.ZSTD_isError(code):
            name = self._ffi.string(self._lib.ZSTD_getErrorName(code)).decode()
            raise CorruptStream(f"zstd: {name}")
        return code

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = self._ffi.from_buffer(buffer)
        self._out.dst, self._out.size, self._out.pos = target, len(target), 0
        if not len(target):
            return 0
        while True:
            if self._in.pos == self._in.size and not self._drained:
                data = self._source.read(INPUT_CHUNK)
                if data:
                    self._input = self._ffi.from_buffer(data)
                    self._in.src, self._in.size, self._in.pos = self._input, len(data), 0
                else:
                    self._drained = True
            if self._in.pos < self._in.size or self._inside:
                # 0 once a frame is decoded and flushed whole; else more is due
                self._inside = self._check(self._lib.ZSTD_decompressStream(
                    self._dctx, self._out, self._in)) != 0
            if self._out.pos:
                return int(self._out.pos)
            if self._drained and self._in.pos == self._in.size:
                if self._inside:
                    raise CorruptStream("zstd: the data ends inside a frame (truncated)")
                return 0
