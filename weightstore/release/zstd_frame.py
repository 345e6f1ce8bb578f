"""One zstd frame, written through libzstd's own streaming API with every parameter named.

python-zstandard's default (C extension) backend accepts a fixed list of parameters, and
zstd 1.5.7's block pre-splitter (``ZSTD_c_blockSplitterLevel``) is not among them; the
archives need it set (see :mod:`.compression`). The same package ships a cffi build of the
same bundled libzstd, ``zstandard.backend_cffi``, whose ``lib`` exposes the whole
parameter API; this module drives ``ZSTD_compressStream2`` through it directly:

* input is handed to libzstd without a copy (``ffi.from_buffer``): the caller may reuse its
  buffer as soon as :meth:`Frame.write` returns (the multi-threaded mode copies what it
  keeps into its own job buffers);
* output goes into buffers the sink lends (:meth:`Sink.buffer`) and is handed back full
  (:meth:`Sink.submit`), so no bytes object is made per chunk and memory stays at the
  sink's pool.

cffi releases the GIL around each libzstd call, so the caller's other threads (hashing,
writing) run meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import PackageError
from ..io.zstd import zstd_lib


class Sink(Protocol):
    def buffer(self) -> bytearray:
        """An empty output buffer (may wait until one is free: that bounds memory)."""

    def submit(self, buffer: bytearray, size: int) -> None:
        """Take the first ``size`` bytes of ``buffer``, then lend it out again."""


class Frame:
    """One frame of exactly ``size`` bytes of content (it is announced in the header)."""

    def __init__(self, parameters: Sequence[tuple[str, int]], size: int, sink: Sink) -> None:
        ffi, lib = zstd_lib()
        self._ffi, self._lib, self._sink = ffi, lib, sink
        cctx = lib.ZSTD_createCCtx()
        if cctx == ffi.NULL:
            raise MemoryError("zstd: cannot allocate a compression context")
        self._cctx = ffi.gc(cctx, lib.ZSTD_freeCCtx)
        for name, value in parameters:
            self._check(lib.ZSTD_CCtx_setParameter(self._cctx, getattr(lib, f"ZSTD_c_{name}"),
                                                   value), f"{name}={value}")
        self._check(lib.ZSTD_CCtx_setPledgedSrcSize(self._cctx, size), f"size={size}")
        self._in = ffi.new("ZSTD_inBuffer *")
        self._out = ffi.new("ZSTD_outBuffer *")
        self._buffer = bytearray()
        self._target: Any = None  # keeps the cdata view of ``_buffer`` alive
        self._lend()

    def _check(self, code: int, what: str) -> int:
        if self._lib.ZSTD_isError(code):
            name = self._ffi.string(self._lib.ZSTD_getErrorName(code)).decode()
            raise PackageError(f"zstd: {name}", setting=what)
        return code

    def _lend(self) -> None:
        self._buffer = self._sink.buffer()
        self._target = self._ffi.from_buffer(self._buffer)
        self._out.dst, self._out.size, self._out.pos = self._target, len(self._buffer), 0

    def _step(self, mode: int) -> int:
        left = self._check(self._lib.ZSTD_compressStream2(self._cctx, self._out, self._in,
                                                          mode), "compress")
        if self._out.pos == self._out.size:
            self._sink.submit(self._buffer, self._out.pos)
            self._lend()
        return left

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Compress ``data``; it is not referenced after this returns."""
        if not len(data):
            return
        source = self._ffi.from_buffer(data)
        try:
            self._in.src, self._in.size, self._in.pos = source, len(source), 0
            while self._in.pos < self._in.size:
                self._step(self._lib.ZSTD_e_continue)
        finally:
            # the export of ``data`` ends here, also when the sink failed (a full disk):
            # left to the garbage collector, a memoryview in the traceback's cycle would
            # be cleared while still exported, and its buffer freed under libzstd's feet
            self._in.src, self._in.size, self._in.pos = self._ffi.NULL, 0, 0
            self._ffi.release(source)

    def close(self) -> None:
        """End the frame (libzstd checks that exactly ``size`` bytes came) and submit the
        last buffer."""
        self._in.src, self._in.size, self._in.pos = self._ffi.NULL, 0, 0
        while self._step(self._lib.ZSTD_e_end):
            pass
        if self._out.pos:
            self._sink.submit(self._buffer, self._out.pos)
        self._out.pos = 0


class BytesSink:
    """Collects a frame in memory (small frames, measurements)."""

    def __init__(self, chunk: int = 1 << 20) -> None:
        self._chunk = chunk
        self.parts: list[bytes] = []

    def buffer(self) -> bytearray:
        return bytearray(self._chunk)

    def submit(self, buffer: bytearray, size: int) -> None:
        self.parts.append(bytes(memoryview(buffer)[:size]))

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


def compress(parameters: Sequence[tuple[str, int]], data: bytes | memoryview) -> bytes:
    """``data`` as one frame with these parameters."""
    sink = BytesSink()
    frame = Frame(parameters, len(data), sink)
    frame.write(data)
    frame.close()
    return sink.getvalue()
