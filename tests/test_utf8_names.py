"""Names that are not valid UTF-8 are refused by every command, naming field and offset.

onnx.proto declares names (tensor, node, initializer, input/output, external-data
entries, metadata keys) as ``string`` fields. onnx's Python API hands such a value back
as ``bytes`` instead of ``str``, and every JSON document weightstore writes names values
by text, so a model whose strings are not UTF-8 cannot be described, packaged or
resolved faithfully: it is refused where the model is read, one line and exit 2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore.catalogue.reader import read_catalogue
from weightstore.cli import main
from weightstore.errors import ModelError

W = np.arange(16, dtype=np.float32).reshape(4, 4)
BAD = b"\xff\xfe"


def _model(folder, marker: str, *, external: bool = False):
    """x @ W with ``marker`` (5 ASCII letters) in one string field, then those bytes
    replaced by ones that are not UTF-8 (same length: the framing is unchanged)."""
    names = {k: k.lower() for k in ("WNAME", "TNAME", "NNAME", "XNAME", "MNAME")}
    names[marker] = marker
    w = numpy_helper.from_array(W, names["WNAME"])
    if external:
        (folder / "LNAME").write_bytes(W.tobytes())
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "LNAME"), ("offset", "0"), ("length", "64")):
            e = w.external_data.add()
            e.key, e.value = k, v
    graph = helper.make_graph(
        [helper.make_node("MatMul", [names["XNAME"], names["WNAME"]], ["y"],
                          name=names["NNAME"])], "g",
        [helper.make_tensor_value_info(names["XNAME"], TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w, numpy_helper.from_array(W, names["TNAME"])])  # TNAME: an unused initializer
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {names["MNAME"]: "v"})
    data = model.SerializeToString()
    offset = data.index(marker.encode())
    path = folder / "m.onnx"
    path.write_bytes(data.replace(marker.encode(), marker[0].encode() + BAD
                                  + marker[3:].encode()))
    return path, offset + 1


CASES = [("WNAME", "NodeProto.input", False), ("TNAME", "TensorProto.name", False),
         ("NNAME", "NodeProto.name", False), ("XNAME", "NodeProto.input", False),
         ("MNAME", "StringStringEntryProto.key", False),
         ("LNAME", "StringStringEntryProto.value", True)]


@pytest.mark.parametrize(("marker", "field", "external"), CASES)
def test_a_name_that_is_not_utf8_is_refused_everywhere(tmp_path, capsys, marker, field,
                                                       external):
    path, offset = _model(tmp_path, marker, external=external)
    with pytest.raises(ModelError) as err, read_catalogue(path):
        pass
    assert err.value.context["field"].endswith(field)
    assert err.value.context["offset"] == offset
    np.savez(tmp_path / "in.npz", xname=np.ones((1, 4), np.float32))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {path}}}]\n"
                      "layouts: [{name: c, external_weight: combined}]\noutput: out\n")
    for argv in (["inspect", str(path)], ["inspect", str(path), "--json"],
                 ["build", str(recipe), "--store", str(tmp_path / "s")],
                 ["convert", "to-external", str(path), str(tmp_path / "o.onnx")],
                 ["convert", "to-inline", str(path), str(tmp_path / "i.onnx")],
                 ["resolve", str(path)],
                 ["run", str(path), "--inputs", str(tmp_path / "in.npz")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        out = capsys.readouterr()
        err = out.err.strip().splitlines()
        assert len(err) == 1 and "UTF-8" in err[0] and str(offset) in err[0], (argv, err)
        if "--json" in argv:
            assert json.loads(err[0])["context"]["offset"] == offset
    assert not (tmp_path / "out").exists() and not (tmp_path / "o.onnx").exists()
    assert not (tmp_path / "i.onnx").exists()


def test_a_bad_name_inside_an_if_branchs_constant_is_refused(tmp_path, capsys):
    """Exporters put weights in Constant nodes with typed fields and shape logic in If
    branches: a tensor name that is not UTF-8 there, two messages deep, is refused too."""
    from weightstore.catalogue.metadata import parse_metadata

    value = helper.make_tensor("CNAME", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=value)], "then", [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])])
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["d"], value_floats=[0.0, 0.0, 0.0, 0.0])],
        "else", [], [helper.make_tensor_value_info("d", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)],
        "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()
    offset = data.index(b"CNAME") + 1
    path = tmp_path / "m.onnx"
    path.write_bytes(data.replace(b"CNAME", b"C" + BAD + b"ME"))
    with pytest.raises(ModelError) as err, read_catalogue(path):
        pass
    assert err.value.context["field"] == "TensorProto.name"
    assert err.value.context["offset"] == offset
    assert parse_metadata(path.read_bytes(), path) is None  # the fast path hands it over
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
