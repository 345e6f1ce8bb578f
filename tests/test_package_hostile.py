"""A package folder that lies to its readers: a FIFO in place of its summary, a summary of
a newer format, a graph onnxruntime would refuse, a device record that contradicts the
summary. Every reader (resolve, check, run, bundle, verify, diff, build) ends in one
typed line with exit code 2, and none runs a graph other than the one asked for."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import weightstore
from weightstore.cli import main
from weightstore.errors import LoadError, PackageError, ResolutionError
from weightstore.passes.analysis import name_problem

from .helpers import every_layout, relist, scenario_package
from .samples import sample_inputs


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """(package folder, inputs .npz) of a split package with two scenarios and a device."""
    folder = tmp_path_factory.mktemp("package-hostile")
    package, model = scenario_package(folder)
    np.savez(folder / "in.npz", **sample_inputs(model))
    return package, folder / "in.npz"


def _copy(package: Path, tmp_path: Path) -> Path:
    out = tmp_path / "pkg"
    shutil.copytree(package, out)
    return out


def _one_line(argv: list[str], capsys) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith("weightstore: error: ") and "\n" not in err, err
    return err


def test_a_fifo_summary_is_refused_without_waiting_for_a_writer(built, tmp_path) -> None:
    package, inputs = built
    folder = _copy(package, tmp_path)
    (folder / "summary.json").unlink()
    os.mkfifo(folder / "summary.json")
    code = "import sys\nfrom weightstore.cli import main\nsys.exit(main(sys.argv[1:]))"
    for argv in (["resolve", str(folder)], ["check", str(folder)], ["verify", str(folder)],
                 ["run", str(folder), "--inputs", str(inputs)],
                 ["bundle", str(folder), "npu", "--output", str(tmp_path / "b")],
                 ["diff", str(folder), str(package)]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                              text=True, timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (argv, done.stderr)
        assert "not a regular file" in lines[0], (argv, lines)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("version", [99, "3", None, 0])
def test_a_summary_of_an_unknown_format_is_refused_by_every_reader(built, tmp_path, capsys,
                                                                   version) -> None:
    package, inputs = built
    folder = _copy(package, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    summary["format_version"] = version
    (folder / "summary.json").write_text(json.dumps(summary))
    for argv in (["resolve", str(folder)], ["check", str(folder)], ["verify", str(folder)],
                 ["run", str(folder), "--inputs", str(inputs)],
                 ["bundle", str(folder), "npu", "--output", str(tmp_path / "b")]):
        err = _one_line(argv, capsys)
        assert f"format_version={version!r}" in err, err


def _edit_model(folder: Path, edit) -> None:
    """Edit the package's model file, and its summary to agree (what the graph holds is
    what is put to the test, not the digest that would refuse it first)."""
    path = folder / "encoder.onnx"
    model = onnx.load(str(path), load_external_data=False)
    edit(model)
    path.write_bytes(model.SerializeToString())
    relist(folder, "encoder.onnx")


def _dangle(model: onnx.ModelProto) -> None:
    next(n for n in model.graph.node if n.op_type == "MatMul").input[0] = "does_not_exist"


def _twice(model: onnx.ModelProto) -> None:
    first = next(n for n in model.graph.node if n.op_type == "MatMul")
    model.graph.node.append(onnx.helper.make_node("Identity", [first.input[0]],
                                                  [first.output[0]]))


@pytest.mark.parametrize("edit, why, value", [
    (_dangle, "a value is read that nothing defines", "does_not_exist"),
    (_twice, "a value is defined twice", "MatMul_"),
])
def test_a_graph_onnxruntime_would_refuse_is_refused_by_resolution(built, tmp_path, capsys,
                                                                   edit, why, value) -> None:
    package, inputs = built
    folder = _copy(package, tmp_path)
    _edit_model(folder, edit)
    with pytest.raises(ResolutionError, match=why) as info:
        weightstore.resolve(folder)
    assert info.value.context["value"].startswith(value)
    assert info.value.context["phase"] == "replay"
    assert info.value.context["scenario"] == "(default)"
    for argv in (["check", str(folder)], ["run", str(folder), "--inputs", str(inputs)]):
        assert why in _one_line(argv, capsys)
    # a scenario of the edited graph is refused before its records are replayed on it
    assert "base graph digest mismatch" in _one_line(
        ["check", str(folder), "--scenario", "fused"], capsys)


def test_the_name_check_passes_every_well_formed_graph(built) -> None:
    package, _ = built
    for scenario in (None, "half", "fused"):
        with weightstore.resolve(package, scenario=scenario) as resolved:
            assert name_problem(resolved.metadata_model) is None
    model = onnx.load(str(package / "encoder.onnx"), load_external_data=False)
    assert name_problem(model) is None
    _dangle(model)
    assert name_problem(model) == ("a value is read that nothing defines", "does_not_exist")


def test_a_model_onnxruntime_refuses_is_a_load_error(built, tmp_path, capsys) -> None:
    package, inputs = built
    folder = _copy(package, tmp_path)

    def unknown_op(model: onnx.ModelProto) -> None:
        next(n for n in model.graph.node if n.op_type == "Gelu" or n.op_type == "Erf"
             ).op_type = "NoSuchOperator"

    _edit_model(folder, unknown_op)
    with weightstore.resolve(folder) as resolved, pytest.raises(LoadError) as info:
        weightstore.load(resolved)
    assert "onnxruntime refused the model" in str(info.value)
    assert info.value.context["model"] == str(folder / "encoder.onnx")
    assert "\n" not in info.value.message
    assert "onnxruntime refused the model" in _one_line(
        ["run", str(folder), "--inputs", str(inputs)], capsys)


@pytest.mark.parametrize("scenario", ["nope", "fused"])
def test_a_device_record_that_contradicts_the_summary_is_refused(built, tmp_path, capsys,
                                                                 scenario) -> None:
    package, inputs = built
    folder = _copy(package, tmp_path)
    record_path = folder / "devices" / "npu" / "bundle.json"
    record = json.loads(record_path.read_text())
    record["models"][0]["scenario"] = scenario
    record_path.write_text(json.dumps(record))
    for argv in (["check", str(folder), "--device", "npu"],
                 ["resolve", str(folder), "--device", "npu"],
                 ["run", str(folder), "--device", "npu", "--inputs", str(inputs)],
                 ["bundle", str(folder), "npu", "--output", str(tmp_path / "b")]):
        err = _one_line(argv, capsys)
        assert "different scenarios" in err and "summary=half" in err, err
    assert not (tmp_path / "b").exists()
    with pytest.raises(PackageError, match="different scenarios"):
        weightstore.resolve(folder, device="npu")
    # the summary edited to agree: an unknown scenario is still refused, never the default
    summary = json.loads((folder / "summary.json").read_text())
    summary["devices"][0]["scenario"] = scenario
    (folder / "summary.json").write_text(json.dumps(summary))
    if scenario == "nope":
        assert "unknown scenario" in _one_line(
            ["run", str(folder), "--device", "npu", "--inputs", str(inputs)], capsys)
    else:
        with weightstore.resolve(folder, device="npu") as resolved:
            assert resolved.selected_scenario == "fused"


def test_one_agreement_rule_for_folders_and_store_references(built) -> None:
    """The rule `read_bundle` applies to a folder's record is the one a store reference's
    record (read from the store) goes through too."""
    from weightstore.package.bundle_record import check_agreement

    package, _ = built
    summary = json.loads((package / "summary.json").read_text())
    check_agreement(summary, "npu", [("encoder.onnx", "half")], "r")
    check_agreement(summary, "npu", [("encoder.onnx", None)], "r")  # a model lacking it
    with pytest.raises(PackageError, match="different scenarios"):
        check_agreement(summary, "npu", [("encoder.onnx", "fused")], "r")
    with pytest.raises(PackageError, match="lists no such device"):
        check_agreement(summary, "gpu", [("encoder.onnx", "half")], "r")
    check_agreement({"models": []}, "gpu", [("encoder.onnx", "x")], "r")  # lists none


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Layout name -> package folder, for every layout a recipe makes."""
    from .samples import make_encoder

    return every_layout(tmp_path_factory.mktemp("release-hostile"),
                        make_encoder(vocab=100, hidden=16, layers=1, ffn=32), "1")


def _largest_file(folder: Path) -> str:
    """The package's largest file: a weight file, or the model of an embedded layout."""
    summary = json.loads((folder / "summary.json").read_text())
    return max(summary["contents"], key=lambda c: c["size"])["path"]


CLI = "import sys\nfrom weightstore.cli import main\nsys.exit(main(sys.argv[1:]))"


def _spoil(folder: Path, kind: str, tmp_path: Path) -> str:
    """Make ``folder`` one that ``verify`` refuses; the path it names."""
    name = _largest_file(folder)
    path = folder / name
    if kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "symlink":  # to the very bytes the summary lists: only its kind is wrong
        path.rename(tmp_path / "elsewhere")
        path.symlink_to(tmp_path / "elsewhere")
    else:
        name = "notes.txt"
        (folder / name).write_text("not in the summary")
    return name


@pytest.mark.parametrize("kind", ["fifo", "symlink", "unlisted"])
@pytest.mark.parametrize("layout", ["embedded", "separate", "combined", "shared", "split",
                                    "split-sep"])
def test_release_refuses_what_verify_refuses(layouts, tmp_path, kind, layout) -> None:
    """A weight file that is a FIFO (never opened: release would wait for a writer
    forever), a symlink, or a file the summary does not list: release refuses up front
    in one line, exit 2, writing nothing, as verify refuses it (exit 1)."""
    folder = tmp_path / "pkg"
    shutil.copytree(layouts[layout], folder)
    name = _spoil(folder, kind, tmp_path)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", CLI, "release", str(folder), "--output",
                           str(out)], capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "package differs from its summary" in lines[0] and name in lines[0], lines
    assert not out.exists()
    assert main(["verify", str(folder)]) == 1


def test_a_killed_release_s_temp_folder_goes_with_the_next_release(layouts, tmp_path):
    """A release killed mid-way leaves its temp folder; the next release into the folder
    removes it, even one that is refused."""
    folder = tmp_path / "pkg"
    shutil.copytree(layouts["combined"], folder)
    out = tmp_path / "out"
    out.mkdir()
    killed = ("import os, signal, sys\nfrom pathlib import Path\n"
              "from weightstore.io.files import make_temp_dir\n"
              "tmp = make_temp_dir(Path(sys.argv[1]), '.release.')\n"
              "(tmp / 'pkg-1-combined.tar.zst').write_bytes(b'half')\n"
              "os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", killed, str(out)], timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert [p.name.startswith(".release.") for p in out.iterdir()] == [True]
    _spoil(folder, "fifo", tmp_path)
    done = subprocess.run([sys.executable, "-c", CLI, "release", str(folder), "--output",
                           str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert list(out.iterdir()) == []
