"""External-data entries are read as onnxruntime reads them, and refused otherwise.

onnxruntime parses ``offset`` and ``length`` with ``strtoll`` (leading blanks and a sign
taken, trailing text refused, ASCII digits only) where Python's ``int()`` also takes
trailing blanks, underscores and any Unicode decimal digit. Only plain ASCII digits read
the same everywhere; anything else is refused naming the tensor, the key and the value,
by every command that reads a model, through the one parser in ``catalogue.payload``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore.catalogue.descriptors import weight_descriptors
from weightstore.catalogue.reader import read_catalogue
from weightstore.cli import main
from weightstore.errors import ExternalDataError

W = np.arange(16, dtype=np.float32).reshape(4, 4)


def _model(folder, **entries):
    """x @ W, W in w.bin as external data with ``entries`` over the usual ones."""
    (folder / "w.bin").write_bytes(W.tobytes())
    w = numpy_helper.from_array(W, "W")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", "offset": "0", "length": "64", **entries}.items():
        if value is not None:
            e = w.external_data.add()
            e.key, e.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


BAD = [("offset", "+0"), ("offset", " 16"), ("offset", "16 "), ("offset", "1_6"),
       ("offset", "\u0661\u0666"), ("offset", "-16"), ("offset", ""), ("length", "+64"),
       ("length", "0x40"), ("length", "\u0666\u0664"),
       ("location", "w.bin/"), ("location", "sub//w.bin"), ("location", ""),
       ("checksum", "md5:0123"), ("checksum", "sha256:" + "A" * 64),
       ("checksum", "blake3:" + "0" * 63), ("checksum", "deadbeef"),
       ("checksum", "0" * 39), ("checksum", "g" * 40), ("unknown_key", "1")]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_the_parser_refuses_what_onnxruntime_reads_otherwise(key, value):
    from weightstore.catalogue.payload import external_entries

    t = numpy_helper.from_array(W, "W")
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": "w.bin", "offset": "0", "length": "64", key: value}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    with pytest.raises(ExternalDataError) as err:
        external_entries(t)
    assert err.value.context["tensor"] == "W" and err.value.context["key"] == key
    assert err.value.context["value"] == value


def test_the_parser_reads_what_every_reader_reads_the_same():
    from weightstore.catalogue.payload import external_entries

    t = numpy_helper.from_array(W, "W")
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": "sub/w.bin", "offset": "4096", "length": "64",
                 "checksum": "blake3:" + "0" * 64}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    info = external_entries(t)
    assert (info.location, info.offset, info.length) == ("sub/w.bin", 4096, 64)
    assert info.checksum == "blake3:" + "0" * 64


@pytest.mark.parametrize(("key", "value"), [("offset", "+0"), ("offset", " 0"),
                                            ("offset", "\u0660"), ("location", "w.bin/"),
                                            ("checksum", "crc32:1234"),
                                            ("checksum", "0" * 41)])
def test_every_command_refuses_a_loose_entry(tmp_path, capsys, key, value):
    path = _model(tmp_path, **{key: value})
    with pytest.raises(ExternalDataError), read_catalogue(path) as catalogue:
        weight_descriptors(catalogue)
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4), np.float32))
    for argv in (["inspect", str(path)], ["inspect", str(path), "--json"],
                 ["convert", "to-inline", str(path), str(tmp_path / "out.onnx")],
                 ["resolve", str(path)],
                 ["run", str(path), "--inputs", str(tmp_path / "in.npz")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        shown = (repr(value)[1:-1], json.dumps(value)[1:-1])  # text, or --json's escape
        assert len(err) == 1 and any(v in err[0] for v in shown) and key in err[0], argv
    assert not (tmp_path / "out.onnx").exists()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {path}}}]\n"
                      "layouts: [{name: c, external_weight: combined}]\noutput: out\n")
    assert main(["build", str(recipe), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]
    assert not (tmp_path / "out").exists()


def test_a_sha1_checksum_is_read_as_onnx_proto_defines_it():
    """onnx.proto's checksum is the SHA-1 of the whole file at location: read as that,
    never as a payload digest (see test_external_data_checksum for the checks)."""
    from weightstore.catalogue.payload import external_entries

    sha1 = hashlib.sha1(W.tobytes()).hexdigest()
    for written in (sha1, sha1.upper()):
        t = numpy_helper.from_array(W, "W")
        t.data_location = TensorProto.EXTERNAL
        for k, v in {"location": "w.bin", "offset": "0", "length": "64",
                     "checksum": written}.items():
            t.external_data.add(key=k, value=v)
        info = external_entries(t)
        assert (info.checksum, info.file_sha1) == (None, sha1)


def test_a_well_formed_model_still_converts(tmp_path):
    path = _model(tmp_path, offset="0")
    assert main(["convert", "to-inline", str(path), str(tmp_path / "out.onnx")]) == 0
    out = onnx.load(str(tmp_path / "out.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(out.graph.initializer[0]), W)
