"""``weightstore diff``: models, weights, scenarios, devices and fetch sizes."""

from __future__ import annotations

import json

import pytest

from tests.release_helpers import CHANGED, build_two_versions
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
