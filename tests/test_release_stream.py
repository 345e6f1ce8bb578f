"""The zstd frame writer and the archive's output pipeline: pinned frames, exact sizes,
bounded buffers, and failures that neither hang nor leave files behind."""

from __future__ import annotations

import errno
import io
import os

import pytest
import zstandard

from tests.release_helpers import make_checkout
from weightstore.errors import PackageError
from weightstore.release import api
from weightstore.release.api import ReleaseOptions, release
from weightstore.release.compression import PRESPLIT, Compression
from weightstore.release.zstd_frame import BytesSink, Frame, compress


def _weights(n: int) -> bytes:
    import numpy as np

    rng = np.random.default_rng(7)
    return (rng.standard_normal(n // 4).astype(np.float32) * 0.02).tobytes()


def test_frame_carries_size_and_checksum_and_round_trips():
    data = _weights(3 << 20)
    out = compress(Compression().parameters(2), data)
    params = zstandard.get_frame_parameters(out)
    assert params.content_size == len(data) and params.has_checksum and params.dict_id == 0
    assert zstandard.ZstdDecompressor().decompress(out) == data


def test_frame_bytes_do_not_depend_on_workers_or_write_sizes():
    data = _weights(20 << 20)  # more than two 8 MiB jobs
    frames = set()
    for workers, step in ((1, len(data)), (2, 1 << 20), (3, 123_457)):
        sink = BytesSink(chunk=65_536)
        frame = Frame(Compression().parameters(workers), len(data), sink)
        for i in range(0, len(data), step):
            frame.write(memoryview(data)[i:i + step])
        frame.close()
        frames.add(sink.getvalue())
    assert len(frames) == 1


def test_presplitter_setting_is_applied():
    """Setting 2 against libzstd's default (0) at level 3: different bytes, so the
    setting reaches libzstd (on real weights the two differ; see
    docs/reference/formats/release.md)."""
    rng = __import__("numpy").random.default_rng(3)
    # blocks whose statistics change every 48 KiB: where a pre-splitter cuts
    parts = [(rng.standard_normal(12_288) * scale).astype("float32").tobytes()
             for scale in (0.02, 1.0, 1e-4, 30.0) * 8]
    data = b"".join(parts)
    ours = Compression().parameters(2)
    assert ("blockSplitterLevel", PRESPLIT) in ours
    default = [(k, 0 if k == "blockSplitterLevel" else v) for k, v in ours]
    assert compress(ours, data) != compress(default, data)


def test_frame_refuses_a_wrong_size_and_an_unknown_setting():
    frame = Frame(Compression().parameters(1), 10, BytesSink())
    frame.write(b"12345")
    with pytest.raises(PackageError, match="zstd"):
        frame.close()
    with pytest.raises(PackageError, match="zstd"):
        Frame([("windowLog", 40)], 0, BytesSink())


def test_a_failing_writer_neither_hangs_nor_leaves_files(encoder_model, tmp_path,
                                                          monkeypatch):
    """Output buffers go back to the pool even after the writer failed: the feeding
    thread gets the error instead of waiting for a buffer forever."""
    recipe = make_checkout(tmp_path / "checkout", encoder_model)
    release(recipe, ReleaseOptions(jobs=1))
    package = recipe.parent / "out" / "pkg" / "1.0.0" / "combined"
    monkeypatch.setattr(api, "CHUNK", 4096)  # many buffers for a small archive
    made: list[int] = []
    original = api._ArchiveFile.buffer

    def counted(self):
        buffer = original(self)
        made.append(id(buffer))
        return buffer

    writes: list[int] = []

    def full(self, item):  # the disk fills up after a few chunks
        writes.append(item[1])
        if len(writes) > api.BUFFERS + 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(api._ArchiveFile, "buffer", counted)
    monkeypatch.setattr(api._ArchiveFile, "_write", full)
    out = tmp_path / "full"
    with pytest.raises(OSError, match="No space"):
        release(package, ReleaseOptions(output=str(out), jobs=2))
    assert len(set(made)) <= api.BUFFERS < len(made)  # buffers were recycled
    assert not out.exists()  # the folder the failed release made is gone too


def test_a_zstandard_without_its_cffi_module_is_a_one_line_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "zstandard.backend_cffi", None)  # import fails
    with pytest.raises(PackageError, match="cffi backend"):
        Frame(Compression().parameters(1), 0, BytesSink())


_FULL_DISK_RELEASE = """
import gc, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
from weightstore.cli import main
from weightstore.release import compression
compression.JOB_SIZE = 512 << 10  # output while the input streams: the disk fills mid-file
code = main(["release", sys.argv[1], "--output", sys.argv[2], "--jobs", "1"])
gc.collect()  # where a leftover export of the input buffer crashed the interpreter
sys.exit(code)
"""


@pytest.mark.skipif(not hasattr(os, "pwrite"), reason="RLIMIT_FSIZE is POSIX")
def test_release_onto_a_full_disk_is_one_line_and_no_crash(tmp_path):
    """A write that fails while the compressor holds the caller's input buffer (the disk
    fills up in the middle of a weight file) ends with one line and exit 2: the frame gives
    the buffer back before the error leaves it, so the garbage collector never clears an
    exported memoryview (BufferError, then a segfault, exit 139). The release folder the
    run made is removed again."""
    import subprocess
    import sys

    from tests.samples import make_encoder

    model = make_encoder(vocab=4000, hidden=256, layers=1, ffn=256)  # 4 MiB of weights
    recipe = make_checkout(tmp_path / "checkout", model)
    release(recipe, ReleaseOptions(jobs=1))
    package = recipe.parent / "out" / "pkg" / "1.0.0" / "combined"
    out = tmp_path / "releases" / "full"
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _FULL_DISK_RELEASE, str(package),
                               str(out)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("weightstore: error: File too large: ")
        assert str(out) in lines[0]
        assert not out.exists() and (tmp_path / "releases").is_dir()


def _read_all(data: bytes, size: int = 1 << 16) -> bytes:
    from weightstore.io.zstd import FrameReader

    reader, parts = FrameReader(io.BytesIO(data)), []
    while part := reader.read(size):
        assert len(part) <= size
        parts.append(part)
    return b"".join(parts)


def test_the_reader_takes_whole_frames_and_refuses_any_cut():
    """The archive reader gives back every frame's bytes, in reads no larger than asked;
    input that stops anywhere inside a frame (its checksum, its last block, its header)
    is refused, where python-zstandard's stream reader ends quietly."""
    from weightstore.io.zstd import CorruptStream

    data = _weights(1 << 20)
    frame = compress(Compression().parameters(2), data)
    small = zstandard.ZstdCompressor(write_checksum=True).compress(b"tail" * 100)
    assert _read_all(frame + small) == data + b"tail" * 100
    assert _read_all(frame, size=1000) == data
    assert _read_all(b"") == b""
    quiet = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(frame[:-1]),
                                                       read_across_frames=True).read()
    assert quiet == data  # what the library's reader makes of a frame cut short
    for cut in (1, 2, 4, 5, 1000, len(frame) - 3):
        with pytest.raises(CorruptStream, match="ends inside a frame"):
            _read_all(frame[:-cut])
        with pytest.raises(CorruptStream):
            _read_all(frame + small[:-cut] if cut < len(small) else frame + small[:3])
    flipped = bytearray(frame)
    flipped[-2] ^= 1  # the checksum
    with pytest.raises(CorruptStream, match="checksum"):
        _read_all(bytes(flipped))
