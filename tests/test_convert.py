"""Exact round trips between inline, external-data and FileConstant forms."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from weightstore.catalogue.shape_inputs import shape_input_names
from weightstore.catalogue.wire import encode_varint
from weightstore.cli import main
from weightstore.convert import convert_to_external, convert_to_inline
from weightstore.convert.file_constant import DOMAIN, OP_TYPE
from weightstore.errors import (
    ConversionError,
    ExternalDataError,
    IntegrityError,
    PathEscapeError,
)

from .samples import run_onnxruntime, sample_inputs

FORMS = ("external-data", "file-constant")


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString(deterministic=True)


def _all_nodes(model: onnx.ModelProto):
    stack = [model.graph, *model.functions]
    while stack:
        g = stack.pop()
        for n in g.node:
            yield n
            for a in n.attribute:
                stack.extend([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("threshold", [0, 1024])
def test_round_trip_is_byte_exact(encoder_model, save_model, tmp_path, form, threshold):
    src = save_model(encoder_model)
    out = tmp_path / "out.onnx"
    report = convert_to_external(src, out, form=form, threshold=threshold)
    assert report.external_tensors > 0
    onnx.checker.check_model(str(out), full_check=True)
    back = tmp_path / "back.onnx"
    convert_to_inline(out, back)
    assert back.read_bytes() == _bytes(encoder_model)


def test_external_data_runs_bit_identical(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model)
    out = tmp_path / "ext.onnx"
    convert_to_external(src, out, threshold=0, alignment=4096)
    inputs = sample_inputs(encoder_model)
    for use_pooler in (True, False):
        inputs["use_pooler"] = np.array(use_pooler)
        expected = run_onnxruntime(encoder_model, inputs)
        actual = run_onnxruntime(out, inputs)
        for e, a in zip(expected, actual, strict=True):
            assert e.tobytes() == a.tobytes()


@pytest.mark.parametrize("alignment", [1, 64, 512, 4096])
def test_offsets_are_aligned(encoder_model, save_model, tmp_path, alignment):
    out = tmp_path / "ext.onnx"
    convert_to_external(save_model(encoder_model), out, threshold=0, alignment=alignment)
    model = onnx.load(str(out), load_external_data=False)
    offsets = [int(e.value) for i in model.graph.initializer for e in i.external_data
               if e.key == "offset"]
    assert offsets and all(o % alignment == 0 for o in offsets)


@pytest.mark.parametrize("alignment", [1 << 21, 1 << 36, 1 << 62])
def test_alignment_above_one_mib_is_refused_before_any_work(
        encoder_model, save_model, tmp_path, capsys, alignment):
    """A huge alignment made a sparse file of 2**36 bytes per payload (550 GB for the
    encoder) or failed with a bare 'File too large': it is one line naming the value and
    the bound, through the API and the command line, with nothing written."""
    src = save_model(encoder_model)
    out = tmp_path / "out" / "ext.onnx"
    out.parent.mkdir()
    with pytest.raises(ConversionError) as info:
        convert_to_external(src, out, threshold=0, alignment=alignment)
    assert info.value.context["alignment"] == alignment
    assert f"at most 1048576 (1 MiB), got {alignment}" in info.value.message
    for form in ("to-external", "to-file-constant"):
        assert main(["convert", form, str(src), str(out), "--threshold", "0",
                     "--alignment", str(alignment)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"got {alignment}" in err and "1048576" in err, err
    assert os.listdir(out.parent) == []
    # the bound itself is accepted
    convert_to_external(src, out, threshold=0, alignment=1 << 20)
    model = onnx.load(str(out), load_external_data=False)
    assert {int(e.value) % (1 << 20) for i in model.graph.initializer for e in i.external_data
            if e.key == "offset"} == {0}


def test_every_place_is_externalized(encoder_model, save_model, tmp_path):
    """Subgraph initializers and Constants, function Constants, typed-field tensors."""
    out = tmp_path / "fc.onnx"
    convert_to_external(save_model(encoder_model), out, form="file-constant", threshold=1024)
    model = onnx.load(str(out))
    fc = [n for n in _all_nodes(model) if n.op_type == OP_TYPE and n.domain == DOMAIN]
    origins = {helper.get_attribute_value(a) for n in fc for a in n.attribute
               if a.name == "origin"}
    assert origins == {b"constant", b"initializer"}
    assert any(n.op_type == OP_TYPE for f in model.functions for n in f.node)
    assert any(o.domain == DOMAIN for f in model.functions for o in f.opset_import)
    encodings = {helper.get_attribute_value(a) for n in fc for a in n.attribute
                 if a.name == "encoding"}
    assert b"float_data" in encodings
    for node in fc:
        attrs = {a.name for a in node.attribute}
        assert {"location", "offset", "length", "dtype", "shape", "file_id"} <= attrs
    # every big Constant / initializer left the model
    for node in _all_nodes(model):
        if node.op_type == "Constant":
            t = node.attribute[0].t
            assert numpy_helper.to_array(t).nbytes < 1024 or node.output[0] in \
                shape_input_names(model)


def test_shape_inputs_stay_inline(encoder_model, save_model, tmp_path):
    out = tmp_path / "ext.onnx"
    convert_to_external(save_model(encoder_model), out, threshold=0)
    model = onnx.load(str(out), load_external_data=False)
    shapes = shape_input_names(model)
    assert shapes
    for node in _all_nodes(model):
        if node.op_type == "Constant" and node.output[0] in shapes:
            assert node.attribute[0].t.data_location != TensorProto.EXTERNAL


def _typed_model() -> onnx.ModelProto:
    """One Constant per typed field and element type, each an output of the graph."""
    rng = np.random.default_rng(3)
    cases = [
        (TensorProto.FLOAT, rng.standard_normal(300).astype(np.float32)),
        (TensorProto.DOUBLE, rng.standard_normal(300)),
        (TensorProto.INT32, rng.integers(-9, 9, 300, dtype=np.int32)),
        (TensorProto.INT64, rng.integers(-9, 9, 300, dtype=np.int64)),
        (TensorProto.INT8, rng.integers(-9, 9, 1500, dtype=np.int8)),
        (TensorProto.UINT8, rng.integers(0, 255, 1500, dtype=np.uint8)),
        (TensorProto.INT16, rng.integers(-9, 9, 700, dtype=np.int16)),
        (TensorProto.FLOAT16, rng.standard_normal(700).astype(np.float16)),
        (TensorProto.BOOL, rng.integers(0, 2, 1500).astype(bool)),
        (TensorProto.UINT64, rng.integers(0, 9, 300, dtype=np.uint64)),
        (TensorProto.UINT32, rng.integers(0, 9, 300, dtype=np.uint32)),
    ]
    nodes, outputs = [], []
    for i, (dtype, values) in enumerate(cases):
        tensor = helper.make_tensor(f"t{i}", dtype, values.shape, values, raw=False)
        assert not tensor.raw_data
        nodes.append(helper.make_node("Constant", [], [f"c{i}"], value=tensor))
        nodes.append(helper.make_node("Identity", [f"c{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", dtype, values.shape))
    graph = helper.make_graph(nodes, "typed", [], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("form", FORMS)
def test_typed_fields_round_trip_and_run(save_model, tmp_path, form):
    model = _typed_model()
    src = save_model(model)
    out = tmp_path / "out.onnx"
    report = convert_to_external(src, out, form=form, threshold=1024)
    assert report.external_tensors == len(model.graph.node) // 2
    back = tmp_path / "back.onnx"
    convert_to_inline(out, back)
    assert back.read_bytes() == _bytes(model)
    if form == "external-data":
        for e, a in zip(run_onnxruntime(model, {}), run_onnxruntime(out, {}), strict=True):
            assert e.dtype == a.dtype and e.tobytes() == a.tobytes()


@pytest.mark.parametrize("form", FORMS)
def test_a_spelt_out_default_location_survives_the_round_trip(save_model, tmp_path, form):
    """onnxruntime's quantizer writes ``data_location: DEFAULT`` on some initializers: the
    same tensor as without it, but two more bytes, which the reverse conversion keeps
    (raw and typed, as the source model and as its external form's source)."""
    rng = np.random.default_rng(3)
    raw = numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "bias")
    typed = helper.make_tensor("scale", TensorProto.FLOAT, [512],
                               rng.standard_normal(512).astype(np.float32).tolist())
    for t in (raw, typed):
        t.data_location = TensorProto.DEFAULT  # spelt out
    plain = numpy_helper.from_array(np.ones(512, np.float32), "plain")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["a"]), helper.make_node("Mul", ["a", "scale"],
                                                                         ["b"]),
         helper.make_node("Add", ["b", "plain"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])], [raw, typed, plain])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src = save_model(model)
    out, again, back = tmp_path / "out.onnx", tmp_path / "again.onnx", tmp_path / "back.onnx"
    convert_to_external(src, out, form=form, threshold=0)
    converted = [out]
    if form == "external-data":  # recorded, carried on by a conversion of the converted
        convert_to_external(out, again, form=form, threshold=0)
        converted.append(again)
    for path in converted:
        convert_to_inline(path, back)
        assert back.read_bytes() == _bytes(model)
        assert not onnx.load(str(back)).graph.initializer[2].HasField("data_location")
    if form == "external-data":  # a package's model, back inline
        from weightstore import BuildOptions, build

        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"package: p\nversion: '1'\nmodels: [{{name: m, source: {src}}}]\n"
                          "layouts: [{name: c, external_weight: combined, size_threshold: 0}]\n"
                          "output: out\n")
        build(recipe, BuildOptions(store=str(tmp_path / "s"), jobs=1))
        convert_to_inline(tmp_path / "out/p/1/c/m.onnx", back)
        assert back.read_bytes() == _bytes(model)


def test_source_with_external_data(encoder_model, save_model, tmp_path):
    src = save_model(encoder_model, "src/model.onnx", save_as_external_data=True,
                     all_tensors_to_one_file=True, location="model.data", size_threshold=0)
    out = tmp_path / "ext.onnx"
    convert_to_external(src, out, threshold=1024)
    inputs = sample_inputs(encoder_model)
    for e, a in zip(run_onnxruntime(encoder_model, inputs), run_onnxruntime(out, inputs),
                    strict=True):
        assert e.tobytes() == a.tobytes()
    back = tmp_path / "inline.onnx"
    convert_to_inline(src, back)
    inlined = onnx.load(str(back))
    for a, b in zip(inlined.graph.initializer, encoder_model.graph.initializer, strict=True):
        assert np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def _tensors(path: Path) -> list[bytes]:
    return [t.SerializeToString() for t in onnx.load(str(path)).graph.initializer]


def _one_external(tmp_path: Path) -> tuple[Path, Path]:
    w = np.arange(1024, dtype=np.float32)
    init = numpy_helper.from_array(w, "W")
    graph = helper.make_graph([helper.make_node("Identity", ["W"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
                              [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "ext.onnx"
    report = convert_to_external(src, out, threshold=0)
    assert report.data_file is not None
    return out, report.data_file


def test_inline_detects_digest_mismatch(tmp_path):
    out, data = _one_external(tmp_path)
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError) as err:  # onnx.proto's SHA-1 of the data file
        convert_to_inline(out, tmp_path / "back.onnx")
    assert "SHA-1" in err.value.message and err.value.context["file"] == str(data)
    assert "W" in err.value.context["tensor"]
    assert not (tmp_path / "back.onnx").exists()


def test_inline_refuses_range_past_end(tmp_path):
    out, data = _one_external(tmp_path)
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ExternalDataError) as err:
        convert_to_inline(out, tmp_path / "back.onnx")
    assert err.value.context["location"] == data.name


@pytest.mark.parametrize("location", ["../escape.bin", "/etc/passwd", "a/../../x"])
def test_inline_refuses_escaping_location(tmp_path, location):
    out, _ = _one_external(tmp_path)
    model = onnx.load(str(out), load_external_data=False)
    for e in model.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = location
    onnx.save(model, str(out))
    with pytest.raises(PathEscapeError):
        convert_to_inline(out, tmp_path / "back.onnx")


_DTYPES = [
    (TensorProto.FLOAT, np.float32, "float_data"),
    (TensorProto.INT64, np.int64, "int64_data"),
    (TensorProto.INT32, np.int32, "int32_data"),
    (TensorProto.DOUBLE, np.float64, "double_data"),
    (TensorProto.FLOAT16, np.float16, "int32_data"),
    (TensorProto.UINT8, np.uint8, "int32_data"),
]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(st.tuples(st.sampled_from(range(len(_DTYPES))), st.integers(0, 600),
                                st.booleans(), st.booleans()), min_size=1, max_size=6),
       threshold=st.sampled_from([0, 16, 1024]), form=st.sampled_from(FORMS))
def test_round_trip_property(tmp_path_factory, specs, threshold, form):
    """Random tensors, dtypes, encodings and roles: external/FileConstant -> inline is exact."""
    folder = tmp_path_factory.mktemp("prop")
    rng = np.random.default_rng(len(specs))
    nodes, inits, outputs = [], [], []
    for i, (d, n, raw, as_init) in enumerate(specs):
        dtype, np_type, _ = _DTYPES[d]
        values = (rng.standard_normal(n) * 100).astype(np_type)
        tensor = (numpy_helper.from_array(values, f"w{i}") if raw
                  else helper.make_tensor(f"w{i}", dtype, [n], values, raw=False))
        if as_init:
            inits.append(tensor)
            nodes.append(helper.make_node("Identity", [f"w{i}"], [f"y{i}"]))
        else:
            nodes.append(helper.make_node("Constant", [], [f"c{i}"], value=tensor))
            nodes.append(helper.make_node("Identity", [f"c{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", dtype, [n]))
    model = helper.make_model(helper.make_graph(nodes, "p", [], outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    src = folder / "src.onnx"
    onnx.save(model, str(src))
    convert_to_external(src, folder / "out.onnx", form=form, threshold=threshold)
    convert_to_inline(folder / "out.onnx", folder / "back.onnx")
    assert (folder / "back.onnx").read_bytes() == _bytes(model)


def test_refuses_to_overwrite_what_the_input_reads(tmp_path):
    w = np.arange(256, dtype=np.float32)
    graph = helper.make_graph([helper.make_node("Identity", ["W"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src), save_as_external_data=True, location="out_weight_combined",
              size_threshold=0)
    before = (tmp_path / "out_weight_combined").read_bytes()
    with pytest.raises(ConversionError, match="overwrite"):
        convert_to_inline(src, tmp_path / "out_weight_combined")
    with pytest.raises(ConversionError, match="overwrite"):
        convert_to_inline(src, src)
    assert (tmp_path / "out_weight_combined").read_bytes() == before
    assert not (tmp_path / "out.onnx").exists()
    # a data file named after its content never meets the input's file
    report = convert_to_external(src, tmp_path / "out.onnx", threshold=0)
    assert report.data_file.name.startswith("out.")
    assert (tmp_path / "out_weight_combined").read_bytes() == before
    shutil.copyfile(tmp_path / "out.onnx", tmp_path / "copy.onnx")
    with pytest.raises(ConversionError, match="overwrite"):  # ... unless it is that file
        convert_to_external(tmp_path / "copy.onnx", tmp_path / "out.onnx", threshold=0)


def test_signalling_nan_survives_typed_round_trip(tmp_path):
    bits = np.array([0x7FA00001, 0x3F800000] * 200, dtype="<u4")
    tensor = helper.make_tensor("w", TensorProto.FLOAT, [400], [0.0] * 400, raw=False)
    tensor.ClearField("float_data")
    tensor.MergeFromString(b"\x22" + encode_varint(1600) + bits.tobytes())  # packed float_data
    model = helper.make_model(
        helper.make_graph([helper.make_node("Constant", [], ["c"], value=tensor)], "g", [],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [400])]),
        opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    for form in FORMS:
        report = convert_to_external(src, tmp_path / "o.onnx", form=form, threshold=0)
        data = report.data_file.read_bytes()
        assert data[:1600] == bits.tobytes()
        convert_to_inline(tmp_path / "o.onnx", tmp_path / "b.onnx")
        assert (tmp_path / "b.onnx").read_bytes() == _bytes(model)


@pytest.mark.parametrize("form", FORMS)
def test_crash_between_the_two_renames_keeps_the_old_pair(form, shared_pair, tmp_path,
                                                          monkeypatch):
    """Replacing ``out.onnx``: a crash after the data file is written and before the model
    is must leave the old model running its own weights, not the new ones."""
    import weightstore.convert.api as api

    first, second = (tmp_path / "a.onnx", tmp_path / "b.onnx")
    onnx.save(shared_pair[0], str(first))
    onnx.save(shared_pair[1], str(second))
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    convert_to_external(first, out, form=form, threshold=1024)
    inputs = sample_inputs(shared_pair[0])

    def outputs(path: Path) -> list[np.ndarray]:
        if form == "file-constant":
            back = tmp_path / "back.onnx"
            convert_to_inline(path, back)
            path = back
        return run_onnxruntime(path, inputs)

    expected = outputs(out)
    old_files = sorted(p.name for p in out.parent.iterdir())

    def killed(model, path):
        raise KeyboardInterrupt("killed between the renames")

    monkeypatch.setattr(api, "save_model", killed)
    with pytest.raises(KeyboardInterrupt):
        convert_to_external(second, out, form=form, threshold=1024)
    monkeypatch.undo()
    for e, a in zip(expected, outputs(out), strict=True):
        assert np.array_equal(e, a)
    # the finished conversion replaces the pair and leaves only its own data file
    report = convert_to_external(second, out, form=form, threshold=1024)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["m.onnx",
                                                                   report.data_file.name])
    assert report.data_file.name not in old_files
    for e, a in zip(run_onnxruntime(shared_pair[1], inputs), outputs(out), strict=True):
        assert np.array_equal(e, a)


def test_any_output_name_gets_a_plain_data_file_name(tmp_path):
    out, _ = _one_external(tmp_path)
    report = convert_to_external(out.parent / "src.onnx", tmp_path / "my model (v2).onnx",
                                 threshold=0)
    assert report.data_file.name.startswith("my_model__v2_.")
    back = tmp_path / "back.onnx"
    convert_to_inline(tmp_path / "my model (v2).onnx", back)
    again = convert_to_external(back, tmp_path / "my model (v2).onnx", threshold=0,
                                alignment=64)
    assert again.data_file.name != report.data_file.name
    assert len(list(tmp_path.glob("my_model__v2_.*"))) == 1  # the replaced pair's data went


@pytest.mark.parametrize("name", ["_model", "-dash", "über", "模型", "a" * 190, "my model",
                                  "model"])
def test_every_output_name_converts(tmp_path, name):
    """An output whose stem is no plain file name still gets a valid data file name, and
    converts back exactly."""
    out, _ = _one_external(tmp_path)
    target = tmp_path / f"{name}.onnx"
    report = convert_to_external(out.parent / "src.onnx", target, threshold=0)
    assert report.data_file.parent == tmp_path and len(report.data_file.name) < 200
    assert report.data_file.name.startswith(name if name == "model" else "")
    convert_to_inline(target, tmp_path / "back.onnx")
    assert _tensors(tmp_path / "back.onnx") == _tensors(out.parent / "src.onnx")


def test_outputs_whose_stems_clean_alike_never_share_a_data_file(tmp_path):
    """'my model' and 'my_model' once both wrote my_model.<tag>_weight_combined: replacing
    one removed the file the other still used."""
    out, _ = _one_external(tmp_path)
    src = out.parent / "src.onnx"
    first = convert_to_external(src, tmp_path / "my model.onnx", threshold=0)
    second = convert_to_external(src, tmp_path / "my_model.onnx", threshold=0)
    assert first.data_file != second.data_file
    convert_to_external(src, tmp_path / "my model.onnx", threshold=0, alignment=64)
    assert second.data_file.exists() and not first.data_file.exists()
    convert_to_inline(tmp_path / "my_model.onnx", tmp_path / "back.onnx")
    assert _tensors(tmp_path / "back.onnx") == _tensors(src)


def test_an_output_that_is_a_folder_is_refused_before_anything_is_written(tmp_path, capsys):
    out, _ = _one_external(tmp_path)
    (tmp_path / "d").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ConversionError, match="not a regular file"):
        convert_to_external(out.parent / "src.onnx", tmp_path / "d", threshold=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert main(["convert", "to-external", str(out.parent / "src.onnx"), str(tmp_path / "d"),
                 "--threshold", "-5"]) == 2
    assert "--threshold: must be at least 0" in capsys.readouterr().err


def test_a_failed_conversion_removes_the_data_file_it_created(tmp_path, monkeypatch):
    out, _ = _one_external(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("weightstore.convert.api.save_model", refuse)
    with pytest.raises(OSError):
        convert_to_external(out.parent / "src.onnx", tmp_path / "new.onnx", threshold=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_to_inline_reports_what_it_brought_back(tmp_path, capsys):
    out, _ = _one_external(tmp_path)
    report = convert_to_inline(out, tmp_path / "back.onnx")
    assert (report.external_tensors, report.unique_payloads, report.payload_bytes) == (
        1, 1, 4096)
    assert main(["convert", "to-inline", str(out), str(tmp_path / "again.onnx")]) == 0
    assert "(1 tensors brought inline)" in capsys.readouterr().out
