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
from weightstore.build.run import BuildOptions, build
from weightstore.caches import build_stamp
from weightstore.cli import main
from weightstore.errors import PackageError
from weightstore.package.inventory import verify_package
from weightstore.release.api import ReleaseOptions, release
from weightstore.store.location import user_cache_dir

from .helpers import tamper_consistently
from .samples import run_onnxruntime, sample_inputs

NOT_THE_BUILD = "not the build the store recorded"


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
def test_build_does_not_take_a_tampered_folder_for_up_to_date(project: Path, stamp: bool,
                                                               capsys) -> None:
    folder = _folder(project)
    expected = _outputs(folder)
    tamper_consistently(folder)
    if not stamp:
        _forget_stamps()
    with pytest.raises(PackageError, match=NOT_THE_BUILD):
        build(project, BuildOptions(jobs=2))
    assert main(["build", str(project)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NOT_THE_BUILD in err[0] and "--force" in err[0]
    rebuilt = build(project, BuildOptions(jobs=2, force=True))
    assert {p.layout: p.status for p in rebuilt.packages}["combined"] == "built"
    for got, want in zip(_outputs(folder), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    again = build(project, BuildOptions(jobs=2))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]


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
    assert main(["verify", str(folder), "--store", str(store) + "-typo"]) == 2
    assert "no store at this path" in capsys.readouterr().err

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
    tamper_consistently(folder)
    out = project.parent / "rel"
    with pytest.raises(PackageError, match=NOT_THE_BUILD):
        release(project, ReleaseOptions(output=str(out), jobs=1))
    assert main(["release", str(project), "--output", str(out)]) == 2
    assert NOT_THE_BUILD in capsys.readouterr().err
    store = str(project.parent / "store")
    assert main(["release", str(folder), "--store", store, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NOT_THE_BUILD in err[0]
    assert not out.exists() or not any(out.iterdir())
