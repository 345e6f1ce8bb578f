"""``weightstore diff``: models, weights, scenarios, devices and fetch sizes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.release_helpers import CHANGED, HOSTILE_TRICKS, build_two_versions, hostile_copies
from weightstore.cli import main
from weightstore.packaging.diff import diff_packages, open_view


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    return build_two_versions(tmp_path_factory.mktemp("diff"))


def test_identical_packages(two_versions, capsys):
    folder, archive = two_versions["a"]
    result = diff_packages(open_view(folder), open_view(archive))
    assert result.identical and result.fetch_file_bytes == 0
    assert main(["diff", str(folder), str(archive)]) == 0
    assert capsys.readouterr().out.strip().endswith("identical")


def test_changes_by_kind_and_name(two_versions, capsys):
    (fa, aa), (fb, ab) = two_versions["a"], two_versions["b"]
    result = diff_packages(open_view(aa), open_view(fb))
    kinds = {(c.kind, c.what, c.name) for c in result.changes}
    assert ("added", "model", "second") in kinds
    assert ("changed", "weight", f"encoder/{CHANGED}") in kinds
    assert ("added", "device", "edge") in kinds
    assert ("added", "weight", "second/embeddings.word_embeddings.weight") in kinds
    assert ("changed", "file", "encoder_weight_combined") in kinds
    assert not any(c.what == "weight" and c.name.startswith("encoder/") and c.kind != "changed"
                   for c in result.changes)
    changed = next(c for c in result.changes if c.name == f"encoder/{CHANGED}")
    sa = json.loads((fa / "summary.json").read_text())
    old_id = next(w["id"] for w in sa["models"][0]["external_weights"] if w["name"] == CHANGED)
    assert changed.old == old_id and changed.new != old_id
    # a device holding A fetches the new files whole, or only the new payloads
    sb = json.loads((fb / "summary.json").read_text())
    held = {c["digest"] for c in sa["contents"]}
    assert result.fetch_file_bytes == sum(c["size"] for c in sb["contents"]
                                          if c["digest"] not in held)
    assert 0 < result.fetch_payload_bytes < result.fetch_file_bytes
    assert set(result.device_fetch_bytes) == {"cpu", "edge"}
    assert result.device_fetch_bytes["cpu"] < result.fetch_file_bytes
    assert main(["diff", str(aa), str(ab), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["identical"] is False and doc["fetch"]["file_bytes"] == result.fetch_file_bytes


def test_reverse_diff_removes(two_versions):
    (fa, _), (fb, _) = two_versions["a"], two_versions["b"]
    kinds = {(c.kind, c.what, c.name) for c in diff_packages(open_view(fb),
                                                             open_view(fa)).changes}
    assert ("removed", "model", "second") in kinds and ("removed", "device", "edge") in kinds


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "x.tar.zst").write_bytes(b"garbage")
    assert main(["diff", str(tmp_path / "x.tar.zst"), str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("weightstore: error: ")



@pytest.mark.parametrize("side", [0, 1])
def test_a_missing_operand_is_named_as_either_form(two_versions, tmp_path, capsys, side):
    """A path that does not exist may have meant a folder: the error says both forms."""
    folder, _ = two_versions["a"]
    missing = tmp_path / "nowhere"
    argv = [str(folder), str(missing)] if side else [str(missing), str(folder)]
    assert main(["diff", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weightstore: error: no such package folder or archive")
    assert str(missing) in err and len(err.splitlines()) == 1


def _one_line(argv, capsys, code=2) -> str:
    assert main(argv) == code, argv
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    return err


def test_a_changed_copy_of_a_folder_is_not_identical(two_versions, tmp_path, capsys):
    """Four weight bytes changed in a copy: the copy is not what its summary lists, so diff
    refuses it (as verify does), in either order; --no-verify says it hashed nothing."""
    folder, archive = two_versions["a"]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    weights = copy / "encoder_weight_combined"
    data = bytearray(weights.read_bytes())
    data[64:68] = bytes(b ^ 0x5A for b in data[64:68])
    weights.write_bytes(bytes(data))
    for argv in (["diff", str(folder), str(copy)], ["diff", str(copy), str(archive)],
                 ["report", str(folder), "--against", str(copy), "--output",
                  str(tmp_path / "page.html")]):
        err = _one_line(argv, capsys)
        assert "package differs from its summary: digest: encoder_weight_combined" in err
        assert f"folder={copy}" in err
    assert not (tmp_path / "page.html").exists()
    assert main(["diff", str(folder), str(copy), "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "not verified (--no-verify)" in out and out.strip().endswith("identical")
    assert main(["diff", str(folder), str(archive), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"] is True


@pytest.mark.parametrize("kind", ["symlink", "fifo", "unlisted"])
def test_a_folder_verify_refuses_is_refused_even_without_hashing(two_versions, tmp_path,
                                                                 capsys, kind):
    folder, archive = two_versions["a"]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    if kind == "symlink":
        (copy / "encoder.onnx").rename(tmp_path / "elsewhere.onnx")
        (copy / "encoder.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    elif kind == "fifo":
        (copy / "encoder_weight_combined").unlink()
        os.mkfifo(copy / "encoder_weight_combined")
    else:
        (copy / "notes.txt").write_text("not in the summary")
    for flags in ([], ["--no-verify"]):
        err = _one_line(["diff", str(archive), str(copy), *flags], capsys)
        assert "package differs from its summary" in err, err


@pytest.fixture(scope="module")
def hostile(two_versions, tmp_path_factory):
    """name -> a hostile copy of A's archive, under the archive's own file name."""
    _, archive = two_versions["a"]
    root = tmp_path_factory.mktemp("hostile")
    out = {}
    for i, (name, data) in enumerate(sorted(hostile_copies(archive).items())):
        (root / str(i)).mkdir()
        out[name] = root / str(i) / archive.name
        out[name].write_bytes(data)
    return out


@pytest.mark.parametrize("trick", sorted(HOSTILE_TRICKS))
def test_every_reader_refuses_what_unpack_refuses(two_versions, hostile, trick, tmp_path,
                                                  capsys):
    """A copy of a release archive that unpack refuses is refused, in one line and exit 2,
    by unpack, report ARCHIVE, diff (either side, with or without --no-verify) and report
    --against: none calls it identical, none writes a page from it."""
    folder, archive = two_versions["a"]
    bad = hostile[trick]
    commands = [["unpack", str(bad), str(tmp_path / "out")],
                ["report", str(bad), "--output", str(tmp_path / "page.html")],
                ["diff", str(folder), str(bad)], ["diff", str(bad), str(archive)],
                ["report", str(folder), "--against", str(bad), "--output",
                 str(tmp_path / "page.html")]]
    if HOSTILE_TRICKS[trick]:  # what the structure shows, without hashing a byte
        commands.append(["diff", str(bad), str(folder), "--no-verify"])
    for argv in commands:
        _one_line(argv, capsys)
    assert sorted(os.listdir(tmp_path)) == []
