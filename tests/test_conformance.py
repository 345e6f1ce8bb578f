"""The conformance matrix: every tensor shape an exporter writes, through every main path.

``tests/conformance_models.py`` builds the models (every element type in raw and typed
fields, scalars, empty tensors, the size threshold's edges, every Constant attribute,
sparse tensors, strings, subgraphs, functions, training info, awkward names, weights
already external). Each path must give every TensorProto back exactly: convert to
external data or FileConstant and back, build in the GE modes and inline the package,
inspect, check, resolve and load into onnxruntime with outputs bit-identical to the
source's.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import numpy_helper

import weightstore
from weightstore.builder.run import BuildOptions, build
from weightstore.catalogue.graphs import iter_containers
from weightstore.catalogue.inspect import inspect_model
from weightstore.catalogue.payload import expected_nbytes
from weightstore.catalogue.sites import iter_tensor_sites
from weightstore.convert import convert_to_external, convert_to_inline
from weightstore.convert.file_constant import DOMAIN, OP_TYPE
from weightstore.errors import ModelError
from weightstore.packaging.check import check_package

from . import conformance_models as cm
from .samples import run_onnxruntime as _run_onnxruntime


def run_onnxruntime(model, feeds):
    """onnxruntime's outputs of ``model``; where the installed onnxruntime does not run the
    matrix's opset (onnxruntime 1.23, the newest for Python 3.10, stops at opset 23) the
    test skips, saying so, once every check before it has passed."""
    import onnxruntime

    try:
        return _run_onnxruntime(model, feeds)
    except onnxruntime.capi.onnxruntime_pybind11_state.Fail as exc:
        if f"Opset {cm.OPSET} is under development" in str(exc):
            pytest.skip(f"onnxruntime {onnxruntime.__version__} does not run opset "
                        f"{cm.OPSET}, the element-type matrix's")
        raise


LAYOUTS = """
  - {name: embedded, external_weight: embedded}
  - {name: separate, external_weight: separate, size_threshold: 1024}
  - {name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}
  - {name: combined-all, external_weight: combined, alignment: 512, size_threshold: 0}
  - {name: ge-separate, external_weight: separate, size_threshold: 1024, constants: file-constant}
  - {name: ge-combined, external_weight: combined, alignment: 512, size_threshold: 1024,
     constants: file-constant}
"""
EXTERNAL_DATA_LAYOUTS = ("separate", "combined", "combined-all")
FILE_CONSTANT_LAYOUTS = ("ge-separate", "ge-combined")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sources")
    out = {}
    for name, model in (("full", cm.matrix_model()),
                        ("runnable", cm.matrix_model(runnable_only=True))):
        path = folder / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        out[name] = path
    out["external"] = cm.external_source(folder / "ext")
    return out


@pytest.fixture(scope="module")
def expected_outputs(sources: dict[str, Path]) -> list[np.ndarray]:
    return run_onnxruntime(sources["runnable"], {})


@pytest.fixture(scope="module")
def packages(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every layout of a recipe holding the three models; returns the version folder."""
    folder = tmp_path_factory.mktemp("build")
    lines = ["package: matrix", 'version: "1"', "store: {hash: blake3}", "models:"]
    lines += [f"  - {{name: {n}, source: {p}}}" for n, p in sources.items()]
    recipe = folder / "recipe.yaml"
    recipe.write_text("\n".join(lines) + "\nlayouts:" + LAYOUTS + "output: out\n")
    build(recipe, BuildOptions(store=str(folder / "store"), jobs=2))
    return folder / "out" / "matrix" / "1"


def _tensors(model: onnx.ModelProto) -> dict[str, bytes]:
    """Every TensorProto serialized, by path; ``data_location: DEFAULT`` written out (as
    onnx's loader leaves it) is the same as leaving it out."""
    out = {}
    for path, tensor in cm.iter_tensors(model):
        if tensor.data_location == T.DEFAULT:
            tensor.ClearField("data_location")
        out[path] = tensor.SerializeToString()
    return out


def _inline_reference(path: Path) -> onnx.ModelProto:
    """The source with every external payload in raw_data, as onnx itself loads it."""
    return onnx.load(str(path))


def _same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        if x.dtype == object:
            assert x.tolist() == y.tolist()
        else:
            assert x.tobytes() == y.tobytes()


def _external_paths(model: onnx.ModelProto) -> set[str]:
    return {p for p, t in cm.iter_tensors(model) if t.data_location == T.EXTERNAL}


# -- convert -------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["external-data", "file-constant"])
@pytest.mark.parametrize("threshold", [0, cm.THRESHOLD])
def test_convert_round_trip_is_byte_exact(sources, tmp_path, form, threshold):
    src = sources["full"]
    out = tmp_path / "ext" / "model.onnx"
    out.parent.mkdir()
    report = convert_to_external(src, out, form=form, threshold=threshold, jobs=2)
    assert report.external_tensors > 0
    back = tmp_path / "back.onnx"
    convert_to_inline(out, back)
    assert back.read_bytes() == src.read_bytes()
    if form == "external-data":
        onnx.checker.check_model(str(out))


def test_convert_moves_what_it_should(sources, tmp_path):
    """Every initializer and Constant value at or above the threshold leaves the model
    (typed fields included); strings, sparse tensors, attribute forms other than
    ``value`` and what is below the threshold stay inline, each tensor keeping its type."""
    src = sources["full"]
    out = tmp_path / "model.onnx"
    convert_to_external(src, out, threshold=cm.THRESHOLD, jobs=2)
    source = onnx.load(str(src))
    converted = onnx.load(str(out), load_external_data=False)
    moved = _external_paths(converted)
    before = dict(cm.iter_tensors(source))
    after = dict(cm.iter_tensors(converted))
    assert before.keys() == after.keys()
    for path, tensor in before.items():
        other = after[path]
        assert (other.name, other.data_type, list(other.dims)) == \
            (tensor.name, tensor.data_type, list(tensor.dims)), path
        size = expected_nbytes(tensor.data_type, tensor.dims)
        if tensor.data_type == T.STRING or path.split("/")[-1].startswith(("1.", "2.")):
            assert path not in moved, path  # strings; sparse values and indices
        elif size is not None and size < cm.THRESHOLD:
            assert path not in moved, path
    names = {t.name for t in converted.graph.initializer if t.data_location == T.EXTERNAL}
    for data_type in cm.ELEMENT_TYPES:
        assert {f"{cm.type_name(data_type).lower()}_{f}" for f in ("raw", "typed")} <= names
    assert {"f32_at", "f32_above", "u8_at", "u8_above"} <= names
    assert not {"f32_below", "u8_below", "strings"} & names
    by_name = {t.name: t for t in converted.graph.initializer}
    assert by_name["same_bytes_as_int32"].data_type == T.INT32
    assert by_name["same_bytes_u8"].data_type == T.UINT8
    info = {e.key: e.value for e in by_name["same_bytes_u8"].external_data}
    assert info["location"] == {e.key: e.value for e in
                                by_name["CON"].external_data}["location"]


def test_external_data_runs_bit_identical(sources, expected_outputs, tmp_path):
    out = tmp_path / "model.onnx"
    convert_to_external(sources["runnable"], out, threshold=0, jobs=2)
    _same_bits(run_onnxruntime(out, {}), expected_outputs)


def test_external_source_round_trips(sources, tmp_path):
    """Weights already external (subfolder, offsets, no length, checksum) come back
    inline exactly as onnx loads them, and go external and back again unchanged."""
    src = sources["external"]
    reference = _inline_reference(src)
    inline = tmp_path / "inline.onnx"
    convert_to_inline(src, inline)
    assert _tensors(onnx.load(str(inline))) == _tensors(reference)
    for form in ("external-data", "file-constant"):
        out = tmp_path / form / "model.onnx"
        out.parent.mkdir()
        convert_to_external(src, out, form=form, threshold=0, jobs=2)
        back = tmp_path / f"{form}.onnx"
        convert_to_inline(out, back)
        assert back.read_bytes() == inline.read_bytes()
    _same_bits(run_onnxruntime(inline, {}), run_onnxruntime(src, {}))


# -- build ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["embedded", *EXTERNAL_DATA_LAYOUTS,
                                    *FILE_CONSTANT_LAYOUTS])
def test_build_inlines_back_exactly(packages, sources, tmp_path, layout):
    for name in ("full", "runnable"):
        path = packages / layout / f"{name}.onnx"
        back = tmp_path / f"{name}.onnx"
        convert_to_inline(path, back)
        assert back.read_bytes() == sources[name].read_bytes(), (layout, name)
    back = tmp_path / "external.onnx"
    convert_to_inline(packages / layout / "external.onnx", back)
    assert _tensors(onnx.load(str(back))) == _tensors(_inline_reference(sources["external"]))


@pytest.mark.parametrize("layout", EXTERNAL_DATA_LAYOUTS)
def test_build_external_data_layouts(packages, layout):
    """Offsets aligned in combined files, file names safe whatever the tensor names,
    strings and small tensors inline, every tensor keeping its own type."""
    folder = packages / layout
    model = onnx.load(str(folder / "full.onnx"), load_external_data=False)
    onnx.checker.check_model(str(folder / "full.onnx"))
    threshold = 0 if layout == "combined-all" else cm.THRESHOLD
    locations = set()
    for _, tensor in cm.iter_tensors(model):
        if tensor.data_location != T.EXTERNAL:
            continue
        assert expected_nbytes(tensor.data_type, tensor.dims) >= max(threshold, 1)
        info = {e.key: e.value for e in tensor.external_data}
        assert set(info) == {"location", "offset", "length"}  # onnx.proto's, no digest
        locations.add(info["location"])
        if layout != "separate":
            assert int(info["offset"]) % 512 == 0
        assert int(info["length"]) == expected_nbytes(tensor.data_type, tensor.dims)
    for location in locations:
        assert "/" not in location and location.isascii() and (folder / location).is_file()
    strings = next(t for t in model.graph.initializer if t.name == "strings")
    assert strings.data_location != T.EXTERNAL and len(strings.string_data) == 300


@pytest.mark.parametrize("layout", FILE_CONSTANT_LAYOUTS)
def test_build_file_constant_layouts(packages, layout):
    model = onnx.load(str(packages / layout / "full.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == OP_TYPE and n.domain == DOMAIN]
    dtypes = {onnx.helper.get_attribute_value(a) for n in nodes for a in n.attribute
              if a.name == "dtype"}
    assert set(cm.ELEMENT_TYPES) <= dtypes
    inits = {t.name for t in model.graph.initializer}
    assert {"strings", "with_default", "f32_below"} <= inits  # stayed inline


@pytest.mark.parametrize("layout", ["embedded", *EXTERNAL_DATA_LAYOUTS,
                                    *FILE_CONSTANT_LAYOUTS])
def test_check_verify(packages, layout):
    """Checked quietly: folding constants that hold NaNs and infinities (random bits
    here, overflowing masks in real models) is no reason for numpy warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        report = check_package(packages / layout, verify=True)
    assert report.ok, report.to_dict() if hasattr(report, "to_dict") else report


@pytest.mark.parametrize("layout", ["embedded", *EXTERNAL_DATA_LAYOUTS])
def test_resolve_load_run_bit_identical(packages, sources, expected_outputs, layout):
    with weightstore.resolve(packages / layout, model="runnable") as resolved:
        session = weightstore.load(resolved)
        _same_bits(list(session.run(None, {})), expected_outputs)
        if layout != "embedded":  # the weight files from the caller's memory, by name
            files = {e.source.file for e in resolved.payload_manifest.entries}
            buffers = {f: (packages / layout / f).read_bytes() for f in files if f}
            session = weightstore.load(resolved, buffers=buffers)
            _same_bits(list(session.run(None, {})), expected_outputs)
    with weightstore.resolve(packages / layout, model="external") as resolved:
        session = weightstore.load(resolved)
        _same_bits(list(session.run(None, {})), run_onnxruntime(sources["external"], {}))


# -- inspect -------------------------------------------------------------------------------


def _expected_bytes(tensor: T) -> int:
    if tensor.data_type == T.STRING:
        return sum(map(len, tensor.string_data))
    return expected_nbytes(tensor.data_type, tensor.dims)


@pytest.mark.parametrize("layout", ["source", "embedded", "combined", "ge-combined"])
def test_inspect_reports_every_tensor(packages, sources, layout):
    path = sources["full"] if layout == "source" else packages / layout / "full.onnx"
    report = inspect_model(path)
    model = onnx.load(str(path), load_external_data=False)
    tensors = dict(cm.iter_tensors(model))
    listed = {w["path"]: w for w in report["weights"] if w["role"] != "file-constant"}
    assert listed.keys() == tensors.keys()
    assert report["totals"]["bytes"] == inspect_model(sources["full"])["totals"]["bytes"]
    file_constants = [w for w in report["weights"] if w["role"] == "file-constant"]
    assert len(file_constants) == sum(
        1 for container, _ in iter_containers(model) for n in container.node
        if n.op_type == OP_TYPE)
    assert (len(file_constants) > 0) == layout.startswith("ge-")
    for entry in file_constants:
        assert entry["payload"]["location"] and entry["bytes"] == entry["payload"]["length"]
    for key, tensor in tensors.items():
        entry = listed[key]
        assert entry["dtype"] == cm.type_name(tensor.data_type), key
        assert entry["shape"] == list(tensor.dims), key
        assert entry["bytes"] == _expected_bytes(tensor), key
    if layout.startswith("ge-"):
        return
    strings = next(w for w in report["weights"] if w["name"] == "strings")
    assert strings["payload"]["encoding"] == "string_data"
    assert strings["payload"]["location"] is None and strings["bytes"] > 300
    assert report["totals"]["inline_bytes"] >= strings["bytes"]
    table = weightstore.inspect.render_table(report)
    assert "a b\\tc " in table and "inline string_data" in table
    assert all(line.count("\t") == 0 for line in table.splitlines())
    json.dumps(report)


def test_inspect_packed_sizes_match_onnx(sources):
    """Packed types (4-bit, 2-bit, 6-bit floats) report the bytes onnx stores."""
    report = inspect_model(sources["full"])
    model = onnx.load(str(sources["full"]))
    raw = {t.name: len(t.raw_data) for t in model.graph.initializer if t.HasField("raw_data")}
    for entry in report["weights"]:
        if entry["name"] in raw:
            assert entry["bytes"] == raw[entry["name"]], entry["name"]


def test_typed_payloads_decode_like_onnx(sources, tmp_path):
    """Every typed tensor's bytes, as the catalogue recovers them, are the raw bytes onnx
    gives the same values: the store keys a typed and a raw copy of one tensor alike."""
    out = tmp_path / "model.onnx"
    convert_to_external(sources["full"], out, threshold=0, jobs=2)
    model = onnx.load(str(out), load_external_data=False)
    by_name = {t.name: t for t in model.graph.initializer}
    for data_type in cm.ELEMENT_TYPES:
        name = cm.type_name(data_type).lower()
        raw = {e.key: e.value for e in by_name[f"{name}_raw"].external_data}
        typed = {e.key: e.value for e in by_name[f"{name}_typed"].external_data}
        # one key, so one payload: the conversion stores it once, at one range
        assert (raw["location"], raw["offset"]) == (typed["location"], typed["offset"]), name
    source = onnx.load(str(sources["full"]))
    by_name = {t.name: t for t in source.graph.initializer}
    for t in source.graph.initializer:
        if t.name.endswith("_typed"):
            twin = by_name[t.name[:-6] if t.name.endswith("_scalar_typed")
                           else t.name[:-5] + "raw"]
            assert numpy_helper.to_array(t).tobytes() == numpy_helper.to_array(twin).tobytes()


# -- what cannot round trip is refused ------------------------------------------------------


@pytest.mark.parametrize(("data_type", "value"), [
    (T.FLOAT16, -1), (T.BFLOAT16, 70000), (T.UINT8, 300), (T.INT8, 200), (T.BOOL, 2),
    (T.BOOL, -1), (T.UINT16, -5), (T.INT16, 40000), (T.FLOAT8E4M3FN, 256),
])
def test_typed_value_out_of_range_is_refused(tmp_path, data_type, value):
    """A typed value the element type cannot hold (onnxruntime would keep its low bits)
    could not be written back as it was: refused, naming the tensor, not changed."""
    count = cm.count_for(data_type, cm.THRESHOLD)
    tensor = T(name="odd", data_type=data_type, dims=(count,))
    tensor.int32_data.extend([0] * (count - 1) + [value])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["odd"], ["y"])], "g", [],
        [onnx.helper.make_tensor_value_info("y", data_type, (count,))], [tensor])
    src = tmp_path / "m.onnx"
    src.write_bytes(onnx.helper.make_model_gen_version(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ModelError, match="outside") as info:
        convert_to_external(src, tmp_path / "x.onnx", threshold=0, jobs=1)
    assert info.value.context["tensor"] == "graph 'g' initializer 'odd'"
    assert info.value.context["value"] == value
    assert not (tmp_path / "x.onnx").exists()


# -- sources already converted ---------------------------------------------------------------


def _values(path: Path) -> dict[tuple[tuple[str, ...], str], bytes]:
    """Every tensor by graph and value name (a FileConstant source gives its weights back
    as Constant nodes, which runtimes treat as initializers: the name inside the value of
    a Constant is not compared), inline."""
    out = {}
    for site in iter_tensor_sites(onnx.load(str(path))):
        tensor = T()
        tensor.CopyFrom(site.tensor)
        if site.role in ("initializer", "constant"):
            tensor.ClearField("name")
        where = site.value_name or site.key
        if not site.value_name and site.node is not None:  # by node name: nodes may move
            where = f"{site.node.name}/{'/'.join(site.key.split('/')[-3:])}"
        out[(site.scope, where)] = tensor.SerializeToString()
    return out


@pytest.mark.parametrize("second", ["external-data", "file-constant", "inline"])
def test_converted_source_converts_again_exactly(sources, tmp_path, second):
    """A model external data was made of (typed fields recorded in its metadata) goes to
    either form, or back inline through a threshold nothing reaches, with every typed
    field restored."""
    first = tmp_path / "first" / "model.onnx"
    first.parent.mkdir()
    convert_to_external(sources["full"], first, threshold=cm.THRESHOLD, jobs=2)
    out = tmp_path / "second" / "model.onnx"
    out.parent.mkdir()
    form = "external-data" if second == "inline" else second
    convert_to_external(first, out, form=form, threshold=1 << 40 if second == "inline" else 0,
                        jobs=2)
    back = tmp_path / "back.onnx"
    convert_to_inline(out, back)
    assert back.read_bytes() == sources["full"].read_bytes()


def _ge_source(sources: dict[str, Path], folder: Path) -> Path:
    """The runnable matrix as GE holds it: FileConstant nodes (ours) in a folder of its
    own, plus three GE wrote (default domain): by ``file_path`` without ``length``, by a
    ``value`` tensor holding external data, by a ``value`` tensor holding its bytes."""
    path = folder / "ge" / "model.onnx"
    path.parent.mkdir(parents=True)
    convert_to_external(sources["runnable"], path, form="file-constant",
                        threshold=cm.THRESHOLD, jobs=2)
    model = onnx.load(str(path), load_external_data=False)
    values = cm.random_array(T.FLOAT, (2, 3), 990)
    (path.parent / "ge_weight.bin").write_bytes(values.tobytes())
    external = T(name="ge_v", data_type=T.FLOAT, dims=(2, 3), data_location=T.EXTERNAL)
    for key, value in (("location", "ge_weight.bin"), ("offset", "0"), ("length", "24")):
        external.external_data.add(key=key, value=value)
    held = numpy_helper.from_array(cm.random_array(T.FLOAT, (2, 3), 991), "ge_h")
    for node in reversed([
            onnx.helper.make_node("FileConstant", [], ["ge_w"], name="ge_fc",
                                  file_path="ge_weight.bin", shape=[2, 3], dtype=T.FLOAT),
            onnx.helper.make_node("FileConstant", [], ["ge_v"], name="ge_fv", value=external),
            onnx.helper.make_node("FileConstant", [], ["ge_h"], name="ge_fh", value=held)]):
        model.graph.node.insert(0, node)
    for name in ("ge_w", "ge_v", "ge_h"):
        model.graph.node.append(onnx.helper.make_node("Identity", [name], [f"out_{name}"]))
        model.graph.output.append(onnx.helper.make_tensor_value_info(f"out_{name}", T.FLOAT,
                                                                     (2, 3)))
    path.write_bytes(model.SerializeToString())
    return path


def test_file_constant_source_builds_self_contained(sources, expected_outputs, tmp_path):
    """GE models (FileConstant nodes) as build sources: every layout holds its weights
    itself (the embedded one inline), checks, and runs bit-identical."""
    src = _ge_source(sources, tmp_path)
    inline = tmp_path / "inline.onnx"
    convert_to_inline(src, inline)
    reference = run_onnxruntime(inline, {})
    # inspect counts each GE weight once, whichever attributes hold it
    assert inspect_model(src)["totals"]["bytes"] == inspect_model(inline)["totals"]["bytes"]
    _same_bits(reference[:-3], expected_outputs)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"package: ge\nversion: '1'\nmodels:\n  - {{name: m, source: {src}}}\n"
                      f"layouts:{LAYOUTS}output: out\n")
    build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=2))
    for layout in ("embedded", *EXTERNAL_DATA_LAYOUTS, *FILE_CONSTANT_LAYOUTS):
        folder = tmp_path / "out" / "ge" / "1" / layout
        assert check_package(folder, verify=True).ok, layout
        back = tmp_path / f"{layout}.onnx"
        convert_to_inline(folder / "m.onnx", back)
        assert _values(back) == _values(inline), layout
        if layout in FILE_CONSTANT_LAYOUTS:
            continue
        model = onnx.load(str(folder / "m.onnx"), load_external_data=False)
        assert not any(n.op_type == OP_TYPE for c, _ in iter_containers(model) for n in c.node)
        with weightstore.resolve(folder) as resolved:
            _same_bits(list(weightstore.load(resolved).run(None, {})), reference)


@pytest.mark.parametrize("form", ["external-data", "file-constant"])
def test_file_constant_source_converts_to_another_folder(sources, tmp_path, form):
    src = _ge_source(sources, tmp_path)
    inline = tmp_path / "inline.onnx"
    convert_to_inline(src, inline)
    out = tmp_path / "elsewhere" / "model.onnx"
    out.parent.mkdir()
    convert_to_external(src, out, form=form, threshold=0, jobs=2)
    back = tmp_path / "back.onnx"
    convert_to_inline(out, back)
    assert _values(back) == _values(inline)
    if form == "external-data":
        _same_bits(run_onnxruntime(out, {}), run_onnxruntime(inline, {}))
