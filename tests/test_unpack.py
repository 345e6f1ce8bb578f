"""``weightstore unpack``: verified, atomic extraction; hostile archives leave nothing."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.release_helpers import entry, make_checkout, tar_zst
from weightstore.cli import main
from weightstore.errors import IntegrityError, PackageError
from weightstore.io.digests import digest_bytes
from weightstore.packaging.inventory import verify_package
from weightstore.packaging.unpack import unpack
from weightstore.release.api import ReleaseOptions, release

from .helpers import fill
from .samples import run_onnxruntime, sample_inputs


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    from .samples import make_encoder

    root = tmp_path_factory.mktemp("unpack")
    model = make_encoder(vocab=200, hidden=32, layers=1, ffn=64)
    recipe = make_checkout(root, model)
    result = release(recipe, ReleaseOptions(jobs=2, store=str(root / "store")))
    return root, result.output / "pkg-1.0.0-combined.tar.zst", model


def test_unpacked_package_verifies_and_runs_bit_identically(archive, tmp_path, capsys):
    root, path, model = archive
    dest = tmp_path / "pkg"
    assert main(["unpack", str(path), str(dest)]) == 0
    assert "unpacked" in capsys.readouterr().out
    assert verify_package(dest).ok
    built = root / "out" / "pkg" / "1.0.0" / "combined"
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == sorted(
        p.relative_to(built) for p in built.rglob("*"))
    inputs = sample_inputs(model, vocab=200)
    for a, b in zip(run_onnxruntime(dest / "encoder.onnx", inputs),
                    run_onnxruntime(model, inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    mode = (dest / "encoder.onnx").stat().st_mode & 0o777
    assert mode == 0o666 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_existing_destination_is_refused(archive, tmp_path):
    _, path, _ = archive
    dest = tmp_path / "there"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(PackageError, match="already exists"):
        unpack(path, dest)
    assert (dest / "keep").read_text() == "mine"


def _summary(files: dict[str, bytes]) -> bytes:
    return json.dumps({
        "format_version": 3, "package": "p", "version": "1", "layout": {"name": "l"},
        "models": [{"name": "m", "file": "m.onnx", "external_weights": []}],
        "contents": [{"path": k, "size": len(v), "digest": "blake3:" + digest_bytes("blake3", v)}
                     for k, v in sorted(files.items())]}).encode()


GOOD = {"m.onnx": b"model bytes", "w.data": b"\x01" * 700}


def _good_prefix():
    return [entry("p-1-l", kind=tarfile.DIRTYPE, mode=0o755),
            entry("p-1-l/summary.json", _summary(GOOD))]


HOSTILE = {
    "absolute path": [*_good_prefix(), entry("/etc/m.onnx", GOOD["m.onnx"])],
    "dot-dot": [*_good_prefix(), entry("p-1-l/../m.onnx", GOOD["m.onnx"])],
    "symlink": [*_good_prefix(), entry("p-1-l/m.onnx", kind=tarfile.SYMTYPE,
                                       linkname="/etc/passwd")],
    "hard link": [*_good_prefix(), entry("p-1-l/m.onnx", kind=tarfile.LNKTYPE,
                                         linkname="p-1-l/summary.json")],
    "device": [*_good_prefix(), entry("p-1-l/m.onnx", kind=tarfile.CHRTYPE, devmajor=1,
                                      devminor=3)],
    "fifo": [*_good_prefix(), entry("p-1-l/m.onnx", kind=tarfile.FIFOTYPE)],
    "duplicate": [*_good_prefix(), entry("p-1-l/m.onnx", GOOD["m.onnx"]),
                  entry("p-1-l/w.data", GOOD["w.data"]), entry("p-1-l/m.onnx", GOOD["m.onnx"])],
    "size beyond the summary": [*_good_prefix(), entry("p-1-l/m.onnx", GOOD["m.onnx"] + b"!")],
    "content not in the summary": [*_good_prefix(), entry("p-1-l/m.onnx", b"model bytez"),
                                   entry("p-1-l/w.data", GOOD["w.data"])],
    "unlisted file": [*_good_prefix(), entry("p-1-l/evil.sh", b"#!/bin/sh")],
    "missing file": [*_good_prefix(), entry("p-1-l/m.onnx", GOOD["m.onnx"])],
    "no summary first": [entry("p-1-l", kind=tarfile.DIRTYPE),
                         entry("p-1-l/m.onnx", GOOD["m.onnx"])],
    "two top folders": [*_good_prefix(), entry("q/m.onnx", GOOD["m.onnx"])],
    "backslash": [*_good_prefix(), entry("p-1-l/..\\m.onnx", GOOD["m.onnx"])],
    "summary nested too deep": [entry("p-1-l", kind=tarfile.DIRTYPE, mode=0o755),
                                entry("p-1-l/summary.json", b"[" * 100_000 + b"]" * 100_000)],
}


WHY = {
    "absolute path": "unsafe path", "dot-dot": "unsafe path", "backslash": "unsafe path",
    "symlink": "type=symlink", "hard link": "type=hard link", "device": "type=device",
    "fifo": "type=fifo", "duplicate": "duplicate member",
    "size beyond the summary": "size differs from the summary",
    "content not in the summary": "differs from its summary",
    "unlisted file": "not listed in the summary", "missing file": "missing=w.data",
    "no summary first": "summary.json must come first",
    "two top folders": "outside the top folder",
    "summary nested too deep": "nested too deep",
}


@pytest.mark.parametrize("trick", sorted(HOSTILE))
def test_hostile_archive_gets_one_line_and_leaves_nothing(trick, tmp_path, capsys):
    bad = tmp_path / "p-1-l.tar.zst"
    bad.write_bytes(tar_zst(HOSTILE[trick]))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises((PackageError, IntegrityError), match=WHY[trick]):
        unpack(bad, out / "pkg")
    assert list(out.iterdir()) == []
    assert main(["unpack", str(bad), str(out / "pkg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weightstore: error: ") and err.count("\n") == 1
    assert list(out.iterdir()) == []


def test_hand_made_good_archive_unpacks(tmp_path):
    good = tmp_path / "p-1-l.tar.zst"
    good.write_bytes(tar_zst([*_good_prefix(), entry("p-1-l/m.onnx", GOOD["m.onnx"]),
                              entry("p-1-l/w.data", GOOD["w.data"])]))
    result = unpack(good, tmp_path / "pkg")
    assert result.files == 2 and (tmp_path / "pkg" / "w.data").read_bytes() == GOOD["w.data"]


def test_corrupt_and_truncated_archives(archive, tmp_path):
    _, path, _ = archive
    data = path.read_bytes()
    for name, blob in (("truncated", data[: len(data) // 2]),
                       ("flipped", data[:200] + bytes([data[200] ^ 0xFF]) + data[201:]),
                       ("not zstd", b"hello" * 100)):
        (tmp_path / name).mkdir()
        bad = tmp_path / name / path.name  # the archive's own name: only the bytes differ
        bad.write_bytes(blob)
        with pytest.raises((PackageError, IntegrityError)):
            unpack(bad, tmp_path / name / "out")
        assert os.listdir(tmp_path / name) == [path.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flipped", "not zstd", "truncated"]
    assert main(["unpack", str(tmp_path / "missing.tar.zst"), str(tmp_path / "x")]) == 2


def test_bytes_after_the_archive_are_refused(archive, tmp_path):
    """An archive unpacks only as its writer made it: appended garbage, or another frame
    of data after the tar's end, is refused; a reader that stops early (diff) ignores it."""
    import zstandard

    _, path, _ = archive
    data = path.read_bytes()
    cases = {"garbage": (data + b"appended", "corrupt archive"),
             "frame": (data + zstandard.ZstdCompressor().compress(b"x" * 1000),
                       "data after the end of the tar")}
    for name, (blob, why) in cases.items():
        (tmp_path / name).mkdir()
        bad = tmp_path / name / path.name
        bad.write_bytes(blob)
        with pytest.raises(PackageError, match=why):
            unpack(bad, tmp_path / name / "out")
        assert os.listdir(tmp_path / name) == [path.name]
    # zero bytes in a further frame are tar's own padding: accepted
    (tmp_path / "p").mkdir()
    padded = tmp_path / "p" / path.name
    padded.write_bytes(data + zstandard.ZstdCompressor().compress(bytes(10240)))
    assert unpack(padded, tmp_path / "padded").files > 0


def test_huge_extended_header_is_refused_before_it_is_read(tmp_path):
    import zstandard

    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = 1 << 30  # announced; never sent
    raw = header.tobuf(format=tarfile.USTAR_FORMAT) + bytes(4096)
    bad = tmp_path / "pax.tar.zst"
    bad.write_bytes(zstandard.ZstdCompressor().compress(raw))
    with pytest.raises(PackageError, match="extended header"):
        unpack(bad, tmp_path / "pkg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pax.tar.zst"]


def test_parent_must_exist(archive, tmp_path):
    _, path, _ = archive
    with pytest.raises(PackageError, match="parent"):
        unpack(path, tmp_path / "no" / "such" / "pkg")
    assert not (tmp_path / "no").exists()


def test_unpack_output_path_is_relative_to_cwd(archive, tmp_path, monkeypatch):
    _, path, _ = archive
    monkeypatch.chdir(tmp_path)
    unpack(path, Path("rel"))
    assert verify_package(tmp_path / "rel").ok


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    """Opening a FIFO for reading blocks until a writer comes: it is refused at once, by
    unpack and by every other archive reader (``diff``)."""
    import subprocess
    import sys

    fifo = tmp_path / "fifo.tar.zst"
    os.mkfifo(fifo)
    code = ("import sys\nfrom weightstore.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    for argv in (["unpack", str(fifo), str(tmp_path / "out")],
                 ["diff", str(fifo), str(fifo)]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "not a regular file" in lines[0], lines
        assert f"archive={fifo}" in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["fifo.tar.zst"]


def test_a_renamed_archive_is_refused(archive, tmp_path, capsys):
    """An archive is named after the package it holds: one renamed to another layout's
    name is refused with one line giving both names, and nothing is written."""
    _, path, _ = archive
    renamed = tmp_path / path.name.replace("combined", "separate")
    renamed.write_bytes(path.read_bytes())
    assert main(["unpack", str(renamed), str(tmp_path / "pkg")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "file name is not the name of the package it holds" in lines[0]
    assert "pkg-1.0.0-combined.tar.zst" in lines[0] and f"archive={renamed}" in lines[0]
    assert sorted(os.listdir(tmp_path)) == [renamed.name]


def test_a_top_folder_renamed_with_its_archive_is_refused(tmp_path):
    """Renaming the top folder too does not help: it must be the one of the package the
    summary describes (package, version and layout)."""
    bad = tmp_path / "p-1-other.tar.zst"
    bad.write_bytes(tar_zst([entry("p-1-other", kind=tarfile.DIRTYPE, mode=0o755),
                             entry("p-1-other/summary.json", _summary(GOOD)),
                             entry("p-1-other/m.onnx", GOOD["m.onnx"]),
                             entry("p-1-other/w.data", GOOD["w.data"])]))
    with pytest.raises(PackageError, match="not named after the package") as info:
        unpack(bad, tmp_path / "pkg")
    assert info.value.context["expected"] == "p-1-l"
    assert sorted(os.listdir(tmp_path)) == [bad.name]




def test_a_full_disk_names_the_path_and_leaves_nothing(archive, small_disk, capsys):
    """unpack onto a disk that fills up: one line saying what happened and naming the
    file it could not write and the folder, exit 2, no temp folder left; once there is
    space the same command unpacks."""
    _, path, _ = archive
    dest = small_disk / "pkg"
    fill(small_disk, 16 << 10)
    assert main(["unpack", str(path), str(dest)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "No space left on device" in lines[0] and "nothing was unpacked" in lines[0]
    assert f"file={small_disk}/.pkg." in lines[0] and f"folder={dest}" in lines[0]
    assert sorted(os.listdir(small_disk)) == ["filler"]
    os.unlink(small_disk / "filler")
    assert main(["unpack", str(path), str(dest)]) == 0
    assert verify_package(dest).ok
