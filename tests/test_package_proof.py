"""A package folder is the build only when the store proves it: a folder edited so that
it still agrees with its own summary (one model file changed, its new size and digest in
``summary.json``'s ``contents``, the fingerprint left alone) is never taken for the build
by ``build``, ``verify`` or ``release`` while the store holds the build's action record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.release_helpers import make_checkout
from weightstore.builder.run import BuildOptions, build
from weightstore.caches import build_actions, build_stamp
from weightstore.cli import main
from weightstore.packaging.inventory import verify_package
from weightstore.release.api import ReleaseOptions, release
from weightstore.store.location import user_cache_dir

from .helpers import tamper_consistently
from .samples import run_onnxruntime, sample_inputs

NOT_THE_BUILD = "not the build the store recorded"
NOT_PROVEN = "not proven to be the build"


@pytest.fixture
def project(encoder_model, tmp_path: Path) -> Path:
    """A built checkout (store ``store``, packages under ``out``); returns the recipe."""
    recipe = make_checkout(tmp_path, encoder_model)
    build(recipe, BuildOptions(jobs=2))
    return recipe


def _folder(recipe: Path, layout: str = "combined") -> Path:
    return recipe.parent / "out" / "pkg" / "1.0.0" / layout


def _outputs(folder: Path) -> list[np.ndarray]:
    model = folder / "encoder.onnx"
    feed = sample_inputs(onnx.load(str(model), load_external_data=False))
    return run_onnxruntime(model, feed)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def _forget_stamps() -> None:
    shutil.rmtree(user_cache_dir() / build_stamp.FOLDER, ignore_errors=True)


def test_the_tampered_folder_agrees_with_its_own_summary(project: Path) -> None:
    """The attack: nothing inside the folder tells it from the build, but it computes
    other outputs."""
    folder = _folder(project)
    before = _outputs(folder)
    tamper_consistently(folder)
    assert verify_package(folder).ok
    assert not np.allclose(_outputs(folder)[1], before[1])


@pytest.mark.parametrize("stamp", [True, False], ids=["build-stamp", "full-check"])
def test_build_rebuilds_a_folder_the_store_proves_to_be_another(project: Path, stamp: bool,
                                                                capsys) -> None:
    """The store's record names another summary.json for this fingerprint: the folder is
    rebuilt (no --force needed: the fingerprint is the build's own), with one stderr line."""
    folder = _folder(project)
    expected = _outputs(folder)
    tamper_consistently(folder)
    if not stamp:
        _forget_stamps()
    assert main(["build", str(project)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NOT_PROVEN in err[0] and str(folder) in err[0]
    for got, want in zip(_outputs(folder), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    again = build(project, BuildOptions(jobs=2))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]


def _delete_records(store: Path) -> None:
    shutil.rmtree(store / build_actions.FOLDER)


def _corrupt_records(store: Path) -> None:
    for record in (store / build_actions.FOLDER).glob("*.json"):
        doc = json.loads(record.read_bytes())
        doc["mac"] = doc["mac"][::-1]  # a record whose MAC fails counts as missing
        record.write_text(json.dumps(doc))


@pytest.mark.parametrize("unprovable", [_delete_records, _corrupt_records, None],
                         ids=["records-deleted", "record-mac-fails", "fresh-store"])
@pytest.mark.parametrize("stamp", [True, False], ids=["build-stamp", "full-check"])
def test_build_rebuilds_a_tampered_folder_the_store_cannot_prove(
        project: Path, unprovable, stamp: bool, capsys) -> None:
    folder = _folder(project)
    expected = _files(folder)
    tamper_consistently(folder)
    args = ["build", str(project)]
    if unprovable is None:
        args += ["--store", str(project.parent / "fresh-store")]
    else:
        unprovable(project.parent / "store")
    if not stamp:
        _forget_stamps()
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "up-to-date combined" not in out
    lines = err.strip().splitlines()  # the separate layout is not proven either
    assert len(lines) == 2 and all(NOT_PROVEN in line for line in lines)
    assert any(line.startswith(f"weightstore: {folder}: ") for line in lines)
    assert _files(folder) == expected
    assert main(args) == 0  # the rebuild wrote the record: proven now
    out, err = capsys.readouterr()
    assert "up-to-date combined" in out and "up-to-date separate" in out and not err


def test_a_genuine_folder_and_a_fresh_store_rebuild_to_the_same_bytes(project: Path,
                                                                       capsys) -> None:
    """A store that never built the folder proves nothing: the build rebuilds it, to the
    very bytes it had, and records it, so the next build is up to date."""
    before = {p: p.read_bytes() for p in (project.parent / "out").rglob("*") if p.is_file()}
    fresh = str(project.parent / "fresh-store")
    first = build(project, BuildOptions(jobs=2, store=fresh))
    assert [p.status for p in first.packages] == ["built", "built"]
    assert len(capsys.readouterr().err.strip().splitlines()) == 2
    after = {p: p.read_bytes() for p in (project.parent / "out").rglob("*") if p.is_file()}
    assert after == before
    again = build(project, BuildOptions(jobs=2, store=fresh))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]
    assert not capsys.readouterr().err


def test_an_embedded_layout_is_proven_and_rebuilt_when_tampered(tmp_path: Path,
                                                                 encoder_model,
                                                                 capsys) -> None:
    recipe = make_checkout(tmp_path, encoder_model)
    recipe.write_text(recipe.read_text().replace(
        "layouts:\n", "layouts:\n  - {name: embedded, external_weight: embedded}\n"))
    build(recipe, BuildOptions(jobs=2))
    folder = _folder(recipe, "embedded")
    expected = _files(folder)
    _forget_stamps()
    again = build(recipe, BuildOptions(jobs=2))  # proven from its record, not reread
    assert {p.layout: p.status for p in again.packages}["embedded"] == "up-to-date"
    tamper_consistently(folder)
    assert main(["build", str(recipe)]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and NOT_PROVEN in lines[0] and str(folder) in lines[0]
    assert _files(folder) == expected
    third = build(recipe, BuildOptions(jobs=2))
    assert [p.status for p in third.packages] == ["up-to-date"] * 3


def test_verify_says_what_it_proved(project: Path, capsys) -> None:
    folder = _folder(project)
    store = project.parent / "store"
    assert main(["verify", str(folder), "--store", str(store), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["proven"] == "build"
    assert main(["verify", str(folder), "--store", str(store)]) == 0
    assert "the build the store recorded" in capsys.readouterr().out
    # the default store (another one here) does not know this build
    assert main(["verify", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["proven"] == "internal-consistency"
    assert main(["verify", str(folder)]) == 0
    assert "internal consistency only" in capsys.readouterr().out

    tamper_consistently(folder)
    assert main(["verify", str(folder), "--store", str(store), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["proven"] is None
    assert [(p["kind"], p["path"]) for p in doc["problems"]] == [("build", "summary.json")]
    assert main(["verify", str(folder), "--store", str(store)]) == 1
    assert NOT_THE_BUILD in capsys.readouterr().out
    assert main(["verify", str(folder), "--json"]) == 0  # all a storeless verify can see
    assert json.loads(capsys.readouterr().out)["proven"] == "internal-consistency"


def test_release_refuses_a_tampered_folder_the_store_knows(project: Path, capsys) -> None:
    folder = _folder(project)
    expected = _files(folder)
    tamper_consistently(folder)
    out = project.parent / "rel"
    store = str(project.parent / "store")
    assert main(["release", str(folder), "--store", store, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NOT_THE_BUILD in err[0]
    assert not out.exists() or not any(out.iterdir())
    # a recipe's release goes through its build, which rebuilds the folder first
    done = release(project, ReleaseOptions(output=str(out), jobs=1))
    assert "combined" in done.built
    assert _files(folder) == expected


def test_release_of_a_folder_the_store_does_not_know_says_so(project: Path,
                                                              capsys) -> None:
    """A package folder's release cannot rebuild: with a store that holds no record of
    the build (the default store here) it goes on, and says what it proved."""
    out = project.parent / "rel"
    assert main(["release", str(_folder(project)), "--output", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "proven only internally consistent, not the build" in err[0]
    assert list(out.glob("*.tar.zst"))
    assert main(["release", str(_folder(project)), "--output", str(out), "--store",
                 str(project.parent / "store")]) == 0
    assert not capsys.readouterr().err


NOT_A_STORE = "--store is not a weightstore store"


@pytest.mark.parametrize("command", ["verify", "release"])
@pytest.mark.parametrize("where", ["typo", "empty", "other-folder"])
def test_a_store_that_is_not_one_proves_nothing_and_is_refused(project: Path, command: str,
                                                               where: str, capsys) -> None:
    """A mistyped path, an empty folder or any folder that is not a store (neither an
    index nor meta.json) would prove nothing: one line, exit 2, naming the path."""
    folder = _folder(project)
    store = {"typo": project.parent / "store-typo", "empty": project.parent / "empty",
             "other-folder": project.parent / "models"}[where]
    if where == "empty":
        store.mkdir()
    out = project.parent / "rel"
    argv = [command, str(folder), "--store", str(store)]
    assert main(argv + (["--output", str(out)] if command == "release" else [])) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and NOT_A_STORE in err[0] and str(store) in err[0]
    assert not captured.out and not out.exists()
    assert main([command, str(folder), "--store", str(project.parent / "store")]
                + (["--output", str(out)] if command == "release" else [])) == 0
