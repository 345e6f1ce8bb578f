"""A malformed package summary is one PackageError naming the file and the key, for every
command that reads it: never a KeyError or TypeError traceback."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from tests.release_helpers import make_checkout
from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import PackageError
from weightstore.package.summary import check_structure


@pytest.fixture(scope="module")
def package(tmp_path_factory, _encoder_master):
    tmp = tmp_path_factory.mktemp("summary")
    recipe = make_checkout(tmp, copy.deepcopy(_encoder_master))
    build(recipe, BuildOptions(jobs=2))
    return tmp / "out" / "pkg" / "1.0.0" / "separate"


def _mutations(summary: dict) -> list[tuple[str, object, dict]]:
    """Each key of the models, external weights, files and devices dropped, then set to
    null, a string and a list: (the key, its replacement, the mutated summary)."""
    out = []

    def each(path: tuple, value: object) -> None:
        if isinstance(value, dict):
            for k in list(value):
                each((*path, k), value[k])
        elif isinstance(value, list) and value and (
                path in (("models",), ("files",), ("devices",))
                or path[-1] == "external_weights"):
            each((*path, 0), value[0])
        if len(path) > 1 and path[0] in ("models", "files", "devices"):
            for replacement in ("drop", None, "x", [], {"id": 1}):
                mutated = copy.deepcopy(summary)
                parent = mutated
                for p in path[:-1]:
                    parent = parent[p]
                if replacement == "drop":
                    if isinstance(path[-1], int):
                        continue  # one entry fewer is a summary too
                    del parent[path[-1]]
                else:
                    if replacement == value or type(replacement) is type(value):
                        continue
                    parent[path[-1]] = replacement
                out.append((".".join(map(str, path)), replacement, mutated))

    each((), summary)
    return out


def test_every_dropped_or_retyped_key_is_refused_naming_it(package):
    summary = json.loads((package / "summary.json").read_text())
    check_structure(summary, "summary.json")
    mutations = _mutations(summary)
    assert len(mutations) > 50
    optional = {"where", "dtype", "shape", "scenario", "scenarios", "external_sources",
                "model_bytes", "inline_tensors", "inline_bytes", "source_digest", "files",
                "payloads", "padding"}
    for key, replacement, mutated in mutations:
        try:
            check_structure(mutated, "summary.json")
        except PackageError as exc:
            assert exc.context["file"] == "summary.json"
            assert exc.context["key"].replace("[", ".").replace("]", "") == key, key
        else:
            # only an optional key may be dropped; a scenario may be null
            last = key.rsplit(".", 1)[-1]
            assert (replacement == "drop" and last in optional) or (
                last == "scenario" and replacement in (None, "x")), (key, replacement)


@pytest.mark.parametrize("models", [
    [{"name": None}],
    "edit-weight",
])
def test_commands_print_one_line_for_a_malformed_summary(package, tmp_path, capsys, models):
    bad = tmp_path / "pk"
    shutil.copytree(package, bad)
    summary = json.loads((bad / "summary.json").read_text())
    if models == "edit-weight":
        summary["models"][0]["external_weights"] = [{"id": 1}]
    else:
        summary["models"] = models
    (bad / "summary.json").write_text(json.dumps(summary))
    for argv in (["check", str(bad)], ["resolve", str(bad)], ["diff", str(bad), str(package)],
                 ["diff", str(package), str(bad)], ["verify", str(bad)]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("weightstore: error: "), (argv, err)
        assert "summary.json" in err[0] and "models" in err[0], (argv, err)


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../x", ".hidden",
                                  "a\\b", "a\x00b"])
@pytest.mark.parametrize("key", ["file", "location", "files", "devices"])
def test_names_leaving_the_package_folder_are_refused(package, tmp_path, capsys, path, key):
    """A summary names the files readers open inside the folder: one that leads outside
    (``..``, absolute, a backslash or NUL) is refused before anything is opened."""
    copy_ = tmp_path / "pk"
    shutil.copytree(package, copy_)
    summary = json.loads((copy_ / "summary.json").read_text())
    if key == "file":
        summary["models"][0]["file"] = path
    elif key == "location":
        summary["models"][0]["external_weights"][0]["location"] = path
    elif key == "files":
        summary["files"][0]["name"] = path
    else:
        summary["devices"] = [{"name": "cpu", "scenario": None, "files": [path]}]
    with pytest.raises(PackageError, match="outside the package folder"):
        check_structure(summary, "summary.json")
    (copy_ / "summary.json").write_text(json.dumps(summary))
    assert main(["check", str(copy_)]) == 2
    err = capsys.readouterr().err
    assert "outside the package folder" in err and len(err.splitlines()) == 1
