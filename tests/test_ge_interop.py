"""FileConstant nodes written the way GE writes them convert back to inline tensors.

GE resolves a FileConstant's file from the ``location`` attribute, then ``file_path``,
then ``file_id`` through the ``ge.exec.value_bins`` map (here ``--value-bins ID=PATH``).
Its ONNX parser takes dtype, shape and location/offset/length from a ``value`` tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from weightstore.cli import main
from weightstore.convert import convert_to_inline
from weightstore.errors import ConversionError, PathEscapeError

from .samples import run_onnxruntime

VALUES = np.arange(6, dtype=np.float32).reshape(2, 3) * 1.5
OTHER = -VALUES


def _model(node: onnx.NodeProto, folder: Path, name: str = "ge.onnx") -> Path:
    graph = helper.make_graph(
        [node, helper.make_node("Identity", [node.output[0]], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _ge_node(**attrs: object) -> onnx.NodeProto:
    """A FileConstant as GE's graph carries it: default domain, shape and dtype attributes."""
    return helper.make_node("FileConstant", [], ["w"], name="weight_fc", shape=[2, 3],
                            dtype=TensorProto.FLOAT, **attrs)


def _runs_with(path: Path, folder: Path, expected: np.ndarray) -> None:
    out = folder / "inline.onnx"
    convert_to_inline(path, out)
    model = onnx.load(str(out))
    assert not any(n.op_type == "FileConstant" for n in model.graph.node)
    onnx.checker.check_model(model)
    (result,) = run_onnxruntime(out, {})
    assert np.array_equal(result, expected)


def test_file_path_attribute(tmp_path):
    (tmp_path / "w.bin").write_bytes(VALUES.tobytes())
    _runs_with(_model(_ge_node(file_path="w.bin"), tmp_path), tmp_path, VALUES)


def test_location_wins_over_file_path(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"\0" * 8 + VALUES.tobytes())
    (tmp_path / "b.bin").write_bytes(OTHER.tobytes())
    node = _ge_node(location="a.bin", offset=8, length=24, file_path="b.bin")
    _runs_with(_model(node, tmp_path), tmp_path, VALUES)


def test_value_tensor_form_of_ges_onnx_parser(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64 + VALUES.tobytes())
    value = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3],
                        data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "weights.bin"), ("offset", "64"), ("length", "24")):
        value.external_data.add(key=k, value=v)
    node = helper.make_node("FileConstant", [], ["w"], name="weight_fc", value=value)
    _runs_with(_model(node, tmp_path), tmp_path, VALUES)


def test_file_id_through_value_bins(tmp_path, capsys):
    bins = tmp_path / "bins"
    bins.mkdir()
    (bins / "bucket.bin").write_bytes(VALUES.tobytes())
    src = _model(_ge_node(file_id="vector_search_bucket_value_bin"), tmp_path)
    out = tmp_path / "inline.onnx"
    assert main(["convert", "to-inline", str(src), str(out), "--value-bins",
                 f"vector_search_bucket_value_bin={bins / 'bucket.bin'}"]) == 0
    (result,) = run_onnxruntime(out, {})
    assert np.array_equal(result, VALUES)
    capsys.readouterr()
    # without the map the node cannot be resolved: an error naming it, nothing written
    out.unlink()
    assert main(["convert", "to-inline", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "weight_fc" in err and "vector_search_bucket_value_bin" in err
    assert not out.exists()
    assert main(["convert", "to-inline", str(src), str(out), "--value-bins", "nopath"]) == 2
    assert "ID=PATH" in capsys.readouterr().err


def test_a_node_naming_no_file_is_an_error(tmp_path):
    src = _model(_ge_node(), tmp_path)
    with pytest.raises(ConversionError, match="no location, file_path or file_id") as err:
        convert_to_inline(src, tmp_path / "o.onnx")
    assert "weight_fc" in err.value.context["where"]


@pytest.mark.parametrize("attr", ["file_path", "location"])
def test_paths_stay_inside_the_model_folder(tmp_path, attr):
    (tmp_path / "w.bin").write_bytes(VALUES.tobytes())
    inner = tmp_path / "models"
    inner.mkdir()
    src = _model(_ge_node(**{attr: "../w.bin"}), inner)
    with pytest.raises(PathEscapeError):
        convert_to_inline(src, inner / "o.onnx")


def test_a_short_file_is_an_error_naming_the_node(tmp_path):
    (tmp_path / "w.bin").write_bytes(VALUES.tobytes()[:10])
    src = _model(_ge_node(file_path="w.bin"), tmp_path)
    with pytest.raises(Exception, match="past the end") as err:
        convert_to_inline(src, tmp_path / "o.onnx")
    assert err.value.context["file_path"] == "w.bin"


@pytest.mark.parametrize("dtype", [TensorProto.UNDEFINED, TensorProto.INT8])
def test_bytes_that_do_not_fit_dtype_and_shape_are_an_error_naming_the_node(tmp_path, dtype):
    """A node whose dtype and shape do not describe its bytes (an undefined type, or one
    GE's own type numbering would read otherwise) is refused, not written as a broken
    tensor."""
    (tmp_path / "w.bin").write_bytes(VALUES.tobytes())
    node = helper.make_node("FileConstant", [], ["w"], name="weight_fc", shape=[2, 3],
                            dtype=dtype, file_path="w.bin", offset=0, length=24)
    src = _model(node, tmp_path)
    with pytest.raises(ConversionError, match=r"do not fit|not an ONNX element") as err:
        convert_to_inline(src, tmp_path / "o.onnx")
    assert "weight_fc" in err.value.context["where"]
    assert not (tmp_path / "o.onnx").exists()
    recipe = tmp_path / "r.yaml"  # as a build's source: refused too, nothing built
    recipe.write_text('package: p\nversion: "1"\nmodels: [{name: m, source: ge.onnx}]\n'
                      "layouts: [{name: c, external_weight: combined, size_threshold: 4}]\n")
    from weightstore.builder.run import BuildOptions, build
    from weightstore.errors import WeightstoreError

    with pytest.raises(WeightstoreError) as err:
        build(recipe, BuildOptions(store=str(tmp_path / "store")))
    assert "fc" in str(err.value.context.get("where"))
    assert not (tmp_path / "dist").exists()


def test_a_file_id_named_twice_is_refused(tmp_path, capsys):
    (tmp_path / "x.bin").write_bytes(VALUES.tobytes())
    (tmp_path / "y.bin").write_bytes(OTHER.tobytes())
    src = _model(_ge_node(file_id="a"), tmp_path)
    out = tmp_path / "inline.onnx"
    assert main(["convert", "to-inline", str(src), str(out), "--value-bins",
                 f"a={tmp_path / 'x.bin'}", "--value-bins", f"a={tmp_path / 'y.bin'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--value-bins names a file_id twice" in err
    assert "file_id=a" in err and not out.exists()


def test_commands_without_value_bins_say_what_to_do_with_a_file_id(tmp_path, capsys):
    """build and convert to-external take no --value-bins: the error says to bring the
    weights inline with convert to-inline --value-bins first."""
    (tmp_path / "x.bin").write_bytes(VALUES.tobytes())
    src = _model(_ge_node(file_id="a"), tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'package: p\nversion: "1"\nmodels:\n  - {{name: m, source: {src}}}\n'
                      "layouts:\n  - {name: c, external_weight: combined}\noutput: out\n")
    for argv in (["convert", "to-external", str(src), str(tmp_path / "o.onnx")],
                 ["build", str(recipe), "--store", str(tmp_path / "s")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no --value-bins entry" not in err, argv
        assert "weightstore convert to-inline MODEL OUT --value-bins ID=PATH" in err, argv
        assert "file_id=a" in err, argv
    assert main(["convert", "to-inline", str(src), str(tmp_path / "o.onnx")]) == 2
    assert "add --value-bins ID=PATH" in capsys.readouterr().err


def test_a_dot_dot_component_is_refused_as_such(tmp_path):
    """``sub/../w.bin`` stays in the folder, but ``..`` is refused: the error says so."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "w.bin").write_bytes(VALUES.tobytes())
    src = _model(_ge_node(file_path="sub/../w.bin"), tmp_path)
    with pytest.raises(PathEscapeError, match=r"'\.\.' component") as err:
        convert_to_inline(src, tmp_path / "o.onnx")
    assert "leaves" not in err.value.message
