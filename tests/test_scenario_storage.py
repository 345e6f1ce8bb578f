"""Scenario records in ModelProto field 20000, and the base graph digest that binds them."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore._proto import weightstore_pb2 as pb
from weightstore.catalogue.reader import read_catalogue
from weightstore.catalogue.wire import LEN, VARINT, encode_varint, iter_fields
from weightstore.errors import ScenarioError
from weightstore.io.digests import digest_bytes
from weightstore.scenarios.digest import base_graph_digest, default_payload_identity
from weightstore.scenarios.storage import FIELD, read_scenarios, write_scenarios
from weightstore.scenarios.variants import metadata_of

from .samples import make_encoder

OTHER_FIELD = 20999  # another provisional field some other tool might use


def _add_model(bias: list[float] | None = None) -> onnx.ModelProto:
    """Y = X + B, small enough for every consumer (checker, onnxruntime)."""
    b = numpy_helper.from_array(np.array(bias or [1.0, 2.0, 3.0], np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "B"], ["Y"], name="add")], "add",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _if_node() -> onnx.NodeProto:
    """A node whose attributes hold subgraphs with tensors inside."""
    def branch(name: str, values: list[float]) -> onnx.GraphProto:
        const = helper.make_node("Constant", [], [f"{name}_out"],
                                 value=helper.make_tensor(f"{name}_c", TensorProto.FLOAT,
                                                          [2], values))
        return helper.make_graph([const], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out",
                                                                TensorProto.FLOAT, [2])])

    return helper.make_node("If", ["cond"], ["picked"], name="choose",
                            then_branch=branch("then", [1, 2]),
                            else_branch=branch("else", [3, 4]))


def _scenario(name: str = "fast",
              digest: bytes = b"\x01" * 32) -> pb.ModelModificationScenarioProto:
    """A scenario with every field of both messages set."""
    scenario = pb.ModelModificationScenarioProto(
        scenario=name, base_graph_digest=digest, digest_algorithm="blake3",
        replay_format_version=1)
    rewrite = scenario.rewrites.add(operation_name="FuseAddAdd", graph_path=["choose", "then"],
                                    removed_nodes=[0, 2], added_nodes_positions=[1, 0],
                                    removed_initializers=[3])
    rewrite.added_nodes.append(_if_node())
    rewrite.added_nodes.append(helper.make_node("Relu", ["a"], ["b"], name="relu"))
    rewrite.added_initializers.append(
        numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "fused"))
    external = rewrite.added_initializers.add(name="ext", data_type=TensorProto.FLOAT, dims=[4])
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "fast.bin"), ("offset", "0"), ("length", "16"),
                       ("checksum", "blake3:" + "ab" * 32)):
        external.external_data.add(key=key, value=value)
    rewrite.metadata_props.add(key="weightstore.derived", value='{"from": ["B"]}')
    scenario.rewrites.add(operation_name="cleanup", removed_nodes=[5])
    scenario.metadata_props.add(key="device", value="npu")
    scenario.metadata_props.add(key="unknown.key", value="kept")
    return scenario


def _top_level(model: onnx.ModelProto) -> list[tuple[int, int]]:
    data = memoryview(model.SerializeToString())
    return [(f.number, f.wire_type) for f in iter_fields(data, 0, len(data))]


def _with_unknown_varint(model: onnx.ModelProto, number: int, value: int) -> None:
    model.MergeFromString(encode_varint(number << 3 | VARINT) + encode_varint(value))


# -- generated code ------------------------------------------------------------------------


def test_generated_descriptor_is_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) compiles the schema")
    from tools import generate_proto
    from weightstore._proto import descriptor

    fresh = generate_proto.regenerate(tmp_path)
    committed = Path(descriptor.__file__)
    assert fresh.read_bytes() == committed.read_bytes(), (
        "weightstore/_proto/descriptor.py is out of date with schemas/weightstore.proto: "
        "run `python tools/generate_proto.py`")
    assert pb.DESCRIPTOR.serialized_pb == descriptor.SERIALIZED


def test_generated_messages_embed_onnx_classes() -> None:
    rewrite = pb.LocalRewritingProto()
    assert type(rewrite.added_nodes.add()) is onnx.NodeProto
    assert type(rewrite.added_initializers.add()) is onnx.TensorProto
    assert type(rewrite.metadata_props.add()) is onnx.StringStringEntryProto
    field = pb.ModelScenarios.DESCRIPTOR.fields_by_name["modification_scenarios"]
    assert field.number == FIELD == 20000
    numbers = {f.name: f.number for f in pb.ModelModificationScenarioProto.DESCRIPTOR.fields}
    assert numbers == {"scenario": 1, "base_graph_digest": 2, "digest_algorithm": 3,
                       "replay_format_version": 4, "rewrites": 5, "metadata_props": 6}
    numbers = {f.name: f.number for f in pb.LocalRewritingProto.DESCRIPTOR.fields}
    assert numbers == {"operation_name": 1, "graph_path": 2, "removed_nodes": 3,
                       "added_nodes": 4, "added_nodes_positions": 5, "added_initializers": 6,
                       "removed_initializers": 7, "metadata_props": 8}


def test_scenarios_pickle() -> None:
    scenario = _scenario()
    assert pickle.loads(pickle.dumps(scenario)) == scenario


# -- storage -------------------------------------------------------------------------------


def test_round_trip_of_every_field() -> None:
    model = _add_model()
    scenarios = [_scenario("fast"), _scenario("small", b"\x02" * 32)]
    write_scenarios(model, scenarios)
    assert read_scenarios(model) == scenarios
    reparsed = onnx.ModelProto.FromString(model.SerializeToString())
    got = read_scenarios(reparsed)
    assert got == scenarios
    node = got[0].rewrites[0].added_nodes[0]
    then = helper.get_attribute_value(node.attribute[1])
    assert numpy_helper.to_array(then.node[0].attribute[0].t).tolist() == [1.0, 2.0]
    assert got[0].rewrites[0].added_initializers[1].external_data[3].value.endswith("ab")
    assert [(e.key, e.value) for e in got[0].metadata_props] == [("device", "npu"),
                                                                 ("unknown.key", "kept")]
    assert _top_level(model)[-2:] == [(FIELD, LEN), (FIELD, LEN)]


def test_model_scenarios_is_a_view_of_model_proto() -> None:
    model = _add_model()
    write_scenarios(model, [_scenario("a"), _scenario("b")])
    view = pb.ModelScenarios.FromString(model.SerializeToString())
    assert [s.scenario for s in view.modification_scenarios] == ["a", "b"]


def test_write_replaces_keeps_known_fields_and_is_deterministic() -> None:
    model = _add_model()
    before = model.SerializeToString()
    write_scenarios(model, [_scenario("a")])
    write_scenarios(model, [_scenario("b"), _scenario("c")])
    assert [s.scenario for s in read_scenarios(model)] == ["b", "c"]
    fresh = _add_model()
    write_scenarios(fresh, [_scenario("b"), _scenario("c")])
    assert model.SerializeToString() == fresh.SerializeToString()
    write_scenarios(model, [])
    assert read_scenarios(model) == []
    assert model.SerializeToString() == before


def test_other_unknown_fields_survive() -> None:
    model = _add_model()
    model.graph.MergeFromString(encode_varint(20500 << 3 | VARINT) + encode_varint(5))
    _with_unknown_varint(model, OTHER_FIELD, 7)
    write_scenarios(model, [_scenario("a")])
    _with_unknown_varint(model, OTHER_FIELD, 8)
    write_scenarios(model, [_scenario("b")])
    assert [s.scenario for s in read_scenarios(model)] == ["b"]
    fields = _top_level(model)
    assert fields.count((OTHER_FIELD, VARINT)) == 2
    write_scenarios(model, [])
    assert read_scenarios(model) == []
    assert _top_level(model).count((OTHER_FIELD, VARINT)) == 2
    assert (FIELD, LEN) not in _top_level(model)
    graph = memoryview(model.graph.SerializeToString())
    assert (20500, VARINT) in [(f.number, f.wire_type) for f in iter_fields(graph, 0, len(graph))]
    assert model.graph.node[0].op_type == "Add"


def test_hostile_field_contents_are_refused() -> None:
    model = _add_model()
    _with_unknown_varint(model, FIELD, 3)
    with pytest.raises(ScenarioError, match="does not hold scenario messages"):
        read_scenarios(model)
    model = _add_model()
    model.MergeFromString(encode_varint(FIELD << 3 | LEN) + b"\x03\x0a\x05x")
    with pytest.raises(ScenarioError, match="malformed"):
        read_scenarios(model)
    with pytest.raises(ScenarioError, match="not a ModelModificationScenarioProto"):
        write_scenarios(_add_model(), [onnx.NodeProto()])  # type: ignore[list-item]


def test_onnx_save_and_load_keep_scenarios(tmp_path: Path) -> None:
    model = _add_model()
    scenarios = [_scenario("a"), _scenario("b")]
    write_scenarios(model, scenarios)
    onnx.save(model, tmp_path / "m.onnx")
    assert read_scenarios(onnx.load(tmp_path / "m.onnx")) == scenarios
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="ext.bin", size_threshold=0)
    assert read_scenarios(onnx.load(tmp_path / "ext.onnx")) == scenarios


def test_checker_and_onnxruntime_accept_models_with_scenarios(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = _add_model()
    write_scenarios(model, [_scenario("a")])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, tmp_path / "m.onnx")
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                   providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"X": np.array([1, 1, 1], np.float32)})
    assert y.tolist() == [2.0, 3.0, 4.0]


def test_catalogue_keeps_scenarios_in_its_metadata_model(tmp_path: Path) -> None:
    model = make_encoder()
    scenarios = [_scenario("a"), _scenario("b")]
    write_scenarios(model, scenarios)
    onnx.save(model, tmp_path / "m.onnx")
    with read_catalogue(tmp_path / "m.onnx") as catalogue:
        assert catalogue.payloads  # inline payloads were left out ...
        assert read_scenarios(catalogue.model) == scenarios  # ... the scenarios were not


# -- base graph digest ---------------------------------------------------------------------


def _external(model: onnx.ModelProto, name: str, location: str, offset: int,
              checksum: bool = True) -> bytes:
    """Make initializer ``name`` external data (with a checksum); returns its bytes."""
    tensor = next(t for t in model.graph.initializer if t.name == name)
    data = numpy_helper.to_array(tensor).tobytes()
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entries = [("location", location), ("offset", str(offset)), ("length", str(len(data)))]
    if checksum:
        entries.append(("checksum", "blake3:" + digest_bytes("blake3", data)))
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    return data


def test_digest_is_raw_bytes_per_algorithm() -> None:
    model = _add_model()
    blake = base_graph_digest(model)
    sha = base_graph_digest(model, algo="sha256")
    assert len(blake) == len(sha) == 32
    assert blake != sha
    assert base_graph_digest(model, algo="blake3") == blake
    with pytest.raises(ScenarioError, match="unknown digest algorithm"):
        base_graph_digest(model, algo="md5")


def test_digest_is_stable_across_save_load_and_scenarios(tmp_path: Path) -> None:
    model = make_encoder()
    digest = base_graph_digest(model)
    onnx.save(model, tmp_path / "m.onnx")
    assert base_graph_digest(onnx.load(tmp_path / "m.onnx")) == digest
    external = onnx.ModelProto()
    external.CopyFrom(model)  # saving as external data rewrites the model it is given
    onnx.save(external, tmp_path / "e.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="e.bin", size_threshold=0)
    assert base_graph_digest(onnx.load(tmp_path / "e.onnx")) == digest
    # another physical form (small values external, without checksums) is another identity:
    # tools that change a model's form verify its scenarios and re-take the digest
    assert base_graph_digest(onnx.load(tmp_path / "e.onnx", load_external_data=False)) != digest
    write_scenarios(model, [_scenario("a", digest)])
    assert base_graph_digest(model) == digest
    write_scenarios(model, [_scenario("a", digest), _scenario("b", digest)])
    assert base_graph_digest(model) == digest
    model.metadata_props.add(key="weightstore.inline_encodings", value="{}")
    model.producer_name = "another tool"
    assert base_graph_digest(model) == digest


def _edits() -> dict[str, object]:
    def node(m: onnx.ModelProto) -> None:
        m.graph.node[0].op_type = "Sub"

    def attribute(m: onnx.ModelProto) -> None:
        m.graph.node[0].attribute.append(helper.make_attribute("note", 1))

    def initializer_name(m: onnx.ModelProto) -> None:
        m.graph.initializer[0].name = "B2"

    def dtype(m: onnx.ModelProto) -> None:
        m.graph.initializer[0].data_type = TensorProto.INT32

    def dims(m: onnx.ModelProto) -> None:
        m.graph.initializer[0].dims[:] = [3, 1]

    def checksum(m: onnx.ModelProto) -> None:
        m.graph.initializer[0].external_data[3].value = "blake3:" + "0" * 64

    def opset(m: onnx.ModelProto) -> None:
        m.opset_import[0].version = 18

    def function(m: onnx.ModelProto) -> None:
        m.functions.append(helper.make_function("local", "F", ["a"], ["b"],
                                                [helper.make_node("Relu", ["a"], ["b"])],
                                                [helper.make_opsetid("", 17)]))

    return {f.__name__: f for f in (node, attribute, initializer_name, dtype, dims, checksum,
                                    opset, function)}


@pytest.mark.parametrize("edit", sorted(_edits()))
def test_digest_changes_with_the_graph(edit: str) -> None:
    model = _add_model()
    _external(model, "B", "w.bin", 0)
    digest = base_graph_digest(model)
    _edits()[edit](model)  # type: ignore[operator]
    assert base_graph_digest(model) != digest


def test_digest_ignores_physical_locations_and_payload_bytes() -> None:
    first, second = _add_model(), _add_model()
    _external(first, "B", "w.bin", 0)
    _external(second, "B", "elsewhere/other.bin", 4096)
    second.graph.initializer[0].external_data[2].value = "999"  # length: physical too
    assert base_graph_digest(first) == base_graph_digest(second)
    # small inline values are metadata (passes decide on them): they are bound
    garbage = _add_model()
    garbage.graph.initializer[0].raw_data = b"\xff" * 12
    assert base_graph_digest(garbage) != base_graph_digest(_add_model())
    assert base_graph_digest(_add_model([7.0, 8.0, 9.0])) != base_graph_digest(_add_model())
    # large inline payloads are identified by their size only, whatever their bytes
    big_a, big_b = _add_model(), _add_model()
    for m, fill in ((big_a, 1.0), (big_b, 2.0)):
        extra = numpy_helper.from_array(np.full(2048, fill, np.float32), "big")
        m.graph.initializer.append(extra)
    assert base_graph_digest(big_a) == base_graph_digest(big_b)
    assert base_graph_digest(_add_model()) != base_graph_digest(first)  # checksum vs value


def test_catalogued_and_parsed_models_digest_alike(tmp_path: Path) -> None:
    model = make_encoder()
    big = sorted(model.graph.initializer, key=lambda t: -len(t.raw_data))[:3]
    blob = b""
    for tensor in big:
        blob += _external(model, tensor.name, "weights.bin", len(blob))
    (tmp_path / "weights.bin").write_bytes(blob)
    write_scenarios(model, [_scenario("a")])
    onnx.save(model, tmp_path / "m.onnx")
    parsed = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    with read_catalogue(tmp_path / "m.onnx") as catalogue:
        assert catalogue.payloads  # inline tensors remain, omitted from the metadata model
        with pytest.raises(ScenarioError, match="small tensor"):
            base_graph_digest(catalogue.model)  # small values are part of the metadata
    metadata = metadata_of(tmp_path / "m.onnx")
    for algo in ("blake3", "sha256"):
        assert base_graph_digest(metadata, algo=algo) == base_graph_digest(
            parsed, algo=algo) == base_graph_digest(model, algo=algo)


def test_payload_identity_sees_catalogue_paths(tmp_path: Path) -> None:
    model = make_encoder()
    onnx.save(model, tmp_path / "m.onnx")
    seen: dict[str, str] = {}

    def identity(site) -> str:  # type: ignore[no-untyped-def]
        seen[site.key] = default_payload_identity(site)
        return "same"

    with read_catalogue(tmp_path / "m.onnx") as catalogue:
        paths = {"/".join(f"{n}.{i}" for n, i in p) for p in catalogue.payloads}
    custom = base_graph_digest(metadata_of(tmp_path / "m.onnx"), identity)
    assert paths <= set(seen)
    assert custom != base_graph_digest(model)
    assert custom == base_graph_digest(model, lambda site: "same")


OLDER_RUNTIME = """
import sys
from google.protobuf import runtime_version
runtime_version.MAJOR, runtime_version.MINOR = 6, 31  # what a resolver may pick with onnx
from weightstore.cli import main
sys.exit(main(["scenario", "list", sys.argv[1]]))
"""


def test_scenario_messages_load_under_an_older_protobuf_runtime(tmp_path: Path) -> None:
    """No generated code carries a runtime version guard: protobuf 6 is as good as 7."""
    import subprocess
    import sys

    pytest.importorskip("google.protobuf.runtime_version",
                        reason="a protobuf before 5.26 is itself the older runtime")

    path = tmp_path / "m.onnx"
    model = _add_model()
    write_scenarios(model, [_scenario()])
    onnx.save(model, str(path))
    res = subprocess.run([sys.executable, "-c", OLDER_RUNTIME, str(path)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert _scenario().scenario in res.stdout
