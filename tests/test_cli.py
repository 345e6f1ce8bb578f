"""The command line: one clear line and exit code 2 on bad input, nothing touched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from weightstore.cli import main
from weightstore.store import WeightStore

from .test_build import tree, write_recipe

LAYOUT = "\n  - {name: l, external_weight: combined}\n"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightstore", *args], capture_output=True,
                          text=True, check=False)


@pytest.fixture
def project(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "models/encoder.onnx")
    return tmp_path, src


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes; a store's SQLite files by their rows (a checkpoint may move
    rows from the journal to the main file without changing what the index holds)."""
    if not folder.exists():
        return {}
    files = {k: v for k, v in tree(folder).items() if not k.startswith("index.sqlite")}
    if (folder / "index.sqlite").exists():
        rows = sorted((o.key, o.file, o.offset, o.size)
                      for o in WeightStore(folder).objects())
        files["index.sqlite"] = repr(rows).encode()
    return files


BAD_RECIPES = {
    "malformed-yaml": ("package: [unclosed\n", "line"),
    "unknown-key": (None, "colour"),
    "missing-model": (None, "not found"),
    "alignment": (None, "power of two"),
}


@pytest.mark.parametrize("case", ["malformed-yaml", "unknown-key", "missing-model",
                                  "alignment", "not-onnx", "store-is-file",
                                  "different-package", "truncated-model"])
def test_bad_input_exit_2_and_nothing_touched(project, case, capsys):
    folder, src = project
    store = folder / "store"
    recipe = write_recipe(folder, {"encoder": src}, LAYOUT)
    # a first good build, so there is a store and a package to protect
    assert main(["build", str(recipe), "--store", str(store)]) == 0
    capsys.readouterr()
    text = recipe.read_text()
    store_arg = str(store)
    if case == "malformed-yaml":
        recipe.write_text("package: [unclosed\n")
    elif case == "unknown-key":
        recipe.write_text(text.replace("output: out", "output: out\ncolour: blue"))
    elif case == "missing-model":
        recipe.write_text(text.replace(str(src), str(folder / "nope.onnx")))
    elif case == "alignment":
        recipe.write_text(text.replace("combined}", "combined, alignment: 300}"))
    elif case == "not-onnx":
        bogus = folder / "bogus.onnx"
        bogus.write_bytes(b"this is not a model at all\n" * 10)
        recipe.write_text(text.replace(str(src), str(bogus)))
    elif case == "truncated-model":
        cut = folder / "cut.onnx"
        cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
        recipe.write_text(text.replace(str(src), str(cut)))
    elif case == "store-is-file":
        store_arg = str(folder / "a-file")
        Path(store_arg).write_text("x")
    elif case == "different-package":
        recipe.write_text(text.replace('version: "1.0.0"', 'version: "1.0.0"')
                          .replace("combined}", "combined, size_threshold: 0}"))
    before_store, before_out = _snapshot(store), _snapshot(folder / "out")
    code = main(["build", str(recipe), "--store", store_arg])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("weightstore: error: ") and "\n" not in err
    assert _snapshot(store) == before_store
    assert _snapshot(folder / "out") == before_out


def test_error_names_file_line_and_key(project, capsys):
    folder, src = project
    recipe = write_recipe(folder, {"encoder": src}, LAYOUT, extra="colour: blue\n")
    assert main(["build", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "recipe.yaml" in err and "line=" in err and "key=colour" in err


def test_build_json_and_store_commands(project):
    folder, src = project
    store = folder / "store"
    recipe = write_recipe(folder, {"encoder": src}, LAYOUT)
    res = run("build", str(recipe), "--store", str(store), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["packages"][0]["status"] == "built"
    assert data["packages"][0]["summary"]["totals"]["external_weights"] > 0
    assert res.stderr == ""  # no progress bar when not on a terminal
    stats = run("store", "stats", "--store", str(store), "--json")
    assert json.loads(stats.stdout)["objects"] == WeightStore(store).stats().objects
    ok = run("store", "verify", "--store", str(store))
    assert ok.returncode == 0 and "ok" in ok.stdout
    victim = next(store.glob("*_weight_combined"))
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    bad = run("store", "verify", "--store", str(store))
    assert bad.returncode == 1 and "digest" in bad.stdout


def test_store_flag_beats_env_and_recipe(project, monkeypatch, capsys):
    folder, src = project
    recipe = write_recipe(folder, {"encoder": src}, LAYOUT)
    recipe.write_text(recipe.read_text().replace("store: {hash: blake3}",
                                                 "store: {hash: blake3, path: from-recipe}"))
    monkeypatch.setenv("WEIGHTSTORE_DIR", str(folder / "from-env"))
    assert main(["build", str(recipe), "--store", str(folder / "from-flag")]) == 0
    assert (folder / "from-flag" / "meta.json").exists()
    assert not (folder / "from-recipe").exists() and not (folder / "from-env").exists()
    assert main(["build", str(recipe), "--force"]) == 0
    assert (folder / "from-recipe" / "meta.json").exists()


def test_convert_commands(project):
    folder, src = project
    fc = folder / "fc.onnx"
    res = run("convert", "to-file-constant", str(src), str(fc), "--threshold", "0")
    assert res.returncode == 0, res.stderr
    assert len(list(folder.glob("fc.*_weight_combined"))) == 1
    back = folder / "back.onnx"
    assert run("convert", "to-inline", str(fc), str(back)).returncode == 0
    assert back.read_bytes() == src.read_bytes()
    missing = run("convert", "to-external", str(folder / "none.onnx"), str(folder / "x.onnx"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_schema_command(tmp_path):
    out = tmp_path / "schema.json"
    assert main(["schema", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["title"]
