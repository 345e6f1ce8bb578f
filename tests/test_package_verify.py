"""Item: every package file's size and digest in the summary; verify; up-to-date check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.release_helpers import make_checkout
from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import PackageError
from weightstore.io.digests import digest_file, make_key
from weightstore.packaging.inventory import verify_package


@pytest.fixture
def package(encoder_model, tmp_path):
    recipe = make_checkout(tmp_path, encoder_model)
    build(recipe, BuildOptions(jobs=2))
    return recipe, tmp_path / "out" / "pkg" / "1.0.0"


def test_summary_lists_every_file_with_size_and_digest(package):
    _, version = package
    for folder in (version / "combined", version / "separate"):
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["format_version"] == 4
        on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                         if (p.is_file() and p.name != "summary.json") or (p.parent != folder
                         and p.is_file()))
        listed = [c["path"] for c in summary["contents"]]
        assert listed == on_disk and "devices/cpu/bundle.json" in listed
        for c in summary["contents"]:
            path = folder / c["path"]
            assert c["size"] == path.stat().st_size
            assert c["digest"] == make_key("blake3", digest_file("blake3", path))


def test_no_lock_files_in_the_output_tree(package):
    _, version = package
    assert sorted(os.listdir(version)) == ["combined", "separate"]
    hidden = [p for p in (version.parent.parent).rglob(".*")]
    assert hidden == []
    assert list((version.parents[2] / "store" / "locks").glob("*.lock"))


def test_verify_names_each_mismatch(package, capsys):
    _, version = package
    folder = version / "combined"
    assert verify_package(folder).ok
    model = folder / "encoder.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF  # same size, other content
    model.write_bytes(bytes(data))
    (folder / "encoder_weight_combined").unlink()
    (folder / "stray.txt").write_text("x")
    report = verify_package(folder)
    assert [(p.kind, p.path) for p in report.problems] == [
        ("digest", "encoder.onnx"), ("missing", "encoder_weight_combined"),
        ("unexpected", "stray.txt")]
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "digest: encoder.onnx" in out and "missing: encoder_weight_combined" in out
    assert main(["verify", str(folder), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and len(doc["problems"]) == 3


def test_same_size_corruption_is_never_up_to_date(package):
    recipe, version = package
    again = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]
    weights = version / "combined" / "encoder_weight_combined"
    st = weights.stat()
    with open(weights, "r+b") as f:  # in place, same size, timestamps put back
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(PackageError, match="damaged package"):
        build(recipe, BuildOptions(jobs=2))
    fixed = build(recipe, BuildOptions(jobs=2, force=True))
    assert [p.status for p in fixed.packages] == ["built", "built"]
    assert verify_package(version / "combined").ok


def test_up_to_date_check_reads_no_unchanged_file_twice(package, monkeypatch):
    import weightstore.package.fingerprint as fp

    recipe, _ = package
    # the files are fresh: trust them anyway
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", -1)
    build(recipe, BuildOptions(jobs=2))  # caches the package files' digests

    hashed: list[Path] = []
    real = fp.digest_file
    monkeypatch.setattr(fp, "digest_file", lambda algo, p: hashed.append(p) or real(algo, p))
    result = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in result.packages] == ["up-to-date", "up-to-date"]
    assert hashed == []


def test_verify_refuses_old_summaries(package):
    _, version = package
    folder = version / "combined"
    summary = json.loads((folder / "summary.json").read_text())
    summary["format_version"] = 1
    del summary["contents"]
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(PackageError, match="no file digests"):
        verify_package(folder)
    assert main(["verify", str(folder)]) == 2
