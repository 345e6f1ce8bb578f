"""Publishing package folders: atomic swap, leftovers cleaned, concurrent builds serialized."""

from __future__ import annotations

import multiprocessing
import sys

import pytest

from weightstore.builder.run import BuildOptions, build
from weightstore.errors import PackageError
from weightstore.io.files import exchange, make_temp_dir, publish_dir

from .test_build import write_recipe


def _folder(parent, name, content):
    d = parent / name
    d.mkdir()
    (d / "file").write_text(content)
    return d


def test_publish_replaces_and_cleans(tmp_path):
    final = _folder(tmp_path, "pkg", "old")
    stale_tmp = _folder(tmp_path, ".pkg.abc123xy.tmp", "crashed build")  # as mkdtemp names
    stale_old = _folder(tmp_path, ".pkg.old-42", "crashed swap")
    other = _folder(tmp_path, ".other.x.tmp", "not ours")
    tmp = make_temp_dir(tmp_path, ".pkg.")
    (tmp / "file").write_text("new")
    publish_dir(tmp, final, replace=True)
    assert (final / "file").read_text() == "new"
    assert not tmp.exists() and not stale_tmp.exists() and not stale_old.exists()
    assert other.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RENAME_EXCHANGE is Linux")
def test_exchange_swaps_atomically(tmp_path):
    a, b = _folder(tmp_path, "a", "A"), _folder(tmp_path, "b", "B")
    assert exchange(a, b)
    assert (a / "file").read_text() == "B" and (b / "file").read_text() == "A"


def _race(args):
    recipe, store = args
    try:
        return build(recipe, BuildOptions(store=store, jobs=1)).packages[0].status
    except PackageError as exc:
        return f"refused: {exc.message}"


def test_concurrent_builds_into_one_folder(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "m.onnx")
    recipes = []
    for i, threshold in enumerate((1024, 0)):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        recipe = write_recipe(folder, {"m": src}, "\n  - {name: l, external_weight: combined, "
                              f"size_threshold: {threshold}}}\n")
        # both recipes publish into the same package folder
        recipe.write_text(recipe.read_text().replace("output: out",
                                                     f"output: {tmp_path / 'shared-out'}"))
        recipes.append(str(recipe))
    store = str(tmp_path / "store")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        outcomes = pool.map(_race, [(r, store) for r in recipes])
    assert sorted(o.split(":")[0] for o in outcomes) == ["built", "refused"]
    assert "different build" in next(o for o in outcomes if o.startswith("refused"))
    leftovers = [p.name for p in (tmp_path / "shared-out/pkg/1.0.0").iterdir()
                 if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []
