"""Scenario records: normalization, serialization and replay from metadata alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from weightstore._proto import weightstore_pb2 as pb
from weightstore.catalogue.descriptors import DerivedWeightRecipe
from weightstore.catalogue.reader import read_catalogue
from weightstore.catalogue.schema import SMALL_VALUE_LIMIT
from weightstore.errors import ScenarioError
from weightstore.passes.rewriting import LocalRewriting, derivations_of, normalize
from weightstore.scenarios.api import (
    AddModificationScenarioOptions,
    add_modification_scenario,
    remove_modification_scenario,
    replay_modification_scenario,
    scenario_names,
    strip_scenarios,
)
from weightstore.scenarios.digest import base_graph_digest
from weightstore.scenarios.storage import read_scenarios, write_scenarios
from weightstore.scenarios.variants import metadata_of

F = TensorProto.FLOAT


def _chain_model(n: int = 4) -> onnx.ModelProto:
    """x -> Relu n0 -> ... -> y, plus an If whose branch adds an initializer."""
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"v{i - 1}"], [f"v{i}"], name=f"n{i}")
             for i in range(n)]
    branch = helper.make_graph(
        [helper.make_node("Add", [f"v{n - 1}", "bias"], ["b_out"], name="inner_add"),
         helper.make_node("Relu", ["b_out"], ["b_relu"], name="inner_relu")],
        "then", [], [helper.make_tensor_value_info("b_relu", F, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "bias")])
    other = helper.make_graph(
        [helper.make_node("Identity", [f"v{n - 1}"], ["e_out"], name="else_id")],
        "else", [], [helper.make_tensor_value_info("e_out", F, [2])])
    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other,
                                  name="if"))
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", F, [2]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2])],
        [numpy_helper.from_array(np.full(2, 3, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _names(graph) -> list[str]:
    return [n.name for n in graph.node]


def _relu(src: str, out: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Relu", [src], [out], name=name)


def test_batch_records_become_sequential():
    model = _chain_model()
    records = [
        # replace n1 in place (same output name)
        LocalRewriting("swap", removed_nodes=(1,), added_nodes=(_relu("v0", "v1", "n1b"),)),
        # in the same batch: positions still refer to the original graph
        LocalRewriting("swap", removed_nodes=(2,), added_nodes=(_relu("v1", "v2", "n2b"),)),
        LocalRewriting("extra", added_nodes=(_relu("x", "extra", "first"),), insert_at=0),
    ]
    protos, result = normalize(model, records)
    assert _names(result.graph) == ["first", "n0", "n1b", "n2b", "n3", "if"]
    assert [list(p.removed_nodes) for p in protos] == [[1], [2], []]
    assert [list(p.added_nodes_positions) for p in protos] == [[1], [2], [0]]
    assert _names(model.graph)[:4] == ["n0", "n1", "n2", "n3"]  # input untouched


def test_nested_graph_path_follows_moved_parent():
    model = _chain_model()
    records = [
        LocalRewriting("front", added_nodes=(_relu("x", "z", "z"),), insert_at=0),
        # batch coordinates: the If is node 4 even though a node now precedes it
        LocalRewriting("inner", graph_path=("4:then_branch",), removed_nodes=(1,),
                       added_nodes=(helper.make_node("Sigmoid", ["b_out"], ["b_relu"],
                                                     name="inner_sig"),)),
    ]
    protos, result = normalize(model, records)
    assert list(protos[1].graph_path) == ["5:then_branch"]
    then = next(a.g for a in result.graph.node[5].attribute if a.name == "then_branch")
    assert _names(then) == ["inner_add", "inner_sig"]


def test_round_trip_every_field_and_replay(tmp_path):
    model = _chain_model()
    derived = helper.make_tensor("w2", F, [2], [0.0, 0.0])
    derived.ClearField("float_data")  # payload-less: bytes come from the recipe
    records = [
        LocalRewriting("inner", graph_path=("4:then_branch",), removed_nodes=(1,),
                       added_nodes=(helper.make_node("Sigmoid", ["b_out"], ["b_relu"],
                                                     name="sig"),),
                       added_initializers=(numpy_helper.from_array(np.zeros(2, np.float32),
                                                                   "inner_zero"),),
                       metadata={"note": "kept"}),
        LocalRewriting("derive", added_initializers=(derived,), removed_initializers=("w",),
                       derivations={"w2": DerivedWeightRecipe("cast", ("w",),
                                                              (("to", "1"),))}),
    ]
    add_modification_scenario(model, "s1", records)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    loaded = onnx.load(str(path))
    (scenario,) = read_scenarios(loaded)
    assert scenario.scenario == "s1" and scenario.replay_format_version == 1
    assert scenario.digest_algorithm == "blake3" and len(scenario.base_graph_digest) == 32
    r0, r1 = scenario.rewrites
    assert list(r0.graph_path) == ["4:then_branch"] and r0.operation_name == "inner"
    assert [e.key for e in r0.metadata_props] == ["note"]
    assert derivations_of(r1)["w2"] == DerivedWeightRecipe("cast", ("w",), (("to", "1"),))
    replayed = replay_modification_scenario(loaded, "s1")
    _, expected = normalize(strip_scenarios(_chain_model()), records)
    assert replayed.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True)
    assert [t.name for t in replayed.graph.initializer] == ["w2"]
    onnx.checker.check_model(loaded, full_check=True)  # onnx keeps the unknown field


def test_replay_needs_metadata_only(tmp_path):
    model = _chain_model()
    big = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "big")
    model.graph.initializer.append(big)
    add_modification_scenario(model, "s", [LocalRewriting(
        "swap", removed_nodes=(0,), added_nodes=(_relu("x", "v0", "n0b"),))])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    data = bytearray(path.read_bytes())
    with read_catalogue(path) as catalogue:
        garbled = 0
        for payload in catalogue.payloads.values():  # garbage over every weight's bytes
            for f in payload.fields:
                if f.end - f.value > SMALL_VALUE_LIMIT:
                    data[f.value:f.end] = b"\xee" * (f.end - f.value)
                    garbled += 1
    assert garbled
    path.write_bytes(bytes(data))
    replayed = replay_modification_scenario(metadata_of(path), "s")
    assert replayed.graph.node[0].name == "n0b"


def test_digest_binds_small_values():
    """A scenario decided on a small constant must not replay on another value."""
    model = _chain_model()
    add_modification_scenario(model, "s", [LocalRewriting(
        "swap", removed_nodes=(0,), added_nodes=(_relu("x", "v0", "n0b"),))])
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.initializer[0].raw_data = np.full(2, 4, np.float32).tobytes()
    replay_modification_scenario(model, "s")
    with pytest.raises(ScenarioError, match="digest mismatch"):
        replay_modification_scenario(changed, "s")


def _one_record_model():
    model = _chain_model()
    add_modification_scenario(model, "s", [LocalRewriting(
        "swap", removed_nodes=(0,), added_nodes=(_relu("x", "v0", "n0b"),))])
    return model


def _tamper(model, change) -> onnx.ModelProto:
    (scenario,) = read_scenarios(model)
    change(scenario)
    write_scenarios(model, [scenario])
    return model


@pytest.mark.parametrize("change, message", [
    (lambda s: s.rewrites[0].removed_nodes.append(99), "out of range"),
    (lambda s: s.rewrites[0].removed_nodes.append(0), "repeat"),
    (lambda s: s.rewrites[0].added_nodes_positions.append(1), "differ in count"),
    (lambda s: s.rewrites[0].added_nodes_positions.__setitem__(0, 40), "out of range"),
    (lambda s: s.rewrites[0].graph_path.append("9:then_branch"), "does not exist"),
    (lambda s: s.rewrites[0].graph_path.append("nonsense"), "malformed"),
    (lambda s: s.rewrites[0].removed_initializers.append(5), "initializer"),
])
def test_malformed_records_fail_naming_scenario_and_record(change, message):
    model = _tamper(_one_record_model(), change)
    with pytest.raises(ScenarioError, match=message) as err:
        replay_modification_scenario(model, "s")
    assert err.value.context["scenario"] == "s" and err.value.context["record"] == 0


def test_scenario_level_failures():
    model = _one_record_model()
    with pytest.raises(ScenarioError, match="unknown scenario") as err:
        replay_modification_scenario(model, "nope")
    assert err.value.context["scenario"] == "nope"
    bad_version = _tamper(_one_record_model(), lambda s: setattr(s, "replay_format_version", 7))
    with pytest.raises(ScenarioError, match="replay format"):
        replay_modification_scenario(bad_version, "s")
    changed = _one_record_model()
    changed.graph.node[3].name = "renamed"  # another graph than the one recorded
    with pytest.raises(ScenarioError, match="digest mismatch") as err:
        replay_modification_scenario(changed, "s")
    assert err.value.context["scenario"] == "s"
    duplicated = _one_record_model()
    write_scenarios(duplicated, read_scenarios(duplicated) * 2)
    with pytest.raises(ScenarioError, match="more than once"):
        replay_modification_scenario(duplicated, "s")


def test_add_rules():
    model = _one_record_model()
    record = [LocalRewriting("swap", removed_nodes=(1,),
                             added_nodes=(_relu("v0", "v1", "n1b"),))]
    with pytest.raises(ScenarioError, match="empty"):
        add_modification_scenario(model, "", record)
    with pytest.raises(ScenarioError, match="already exists"):
        add_modification_scenario(model, "s", record)
    add_modification_scenario(model, "s", record,
                              AddModificationScenarioOptions(replace_existing=True))
    add_modification_scenario(model, "t", record,
                              AddModificationScenarioOptions(digest_algorithm="sha256"))
    assert scenario_names(model) == ["s", "t"]
    assert replay_modification_scenario(model, "t").graph.node[1].name == "n1b"
    remove_modification_scenario(model, "s")
    assert scenario_names(model) == ["t"]
    # reads a value nothing defines: only onnx's checker sees it
    broken = [LocalRewriting("break", removed_nodes=(0,),
                             added_nodes=(_relu("nowhere", "v0", "n0b"),))]
    with pytest.raises(ScenarioError, match="checker") as err:
        add_modification_scenario(model, "u", broken)
    assert err.value.context["scenario"] == "u"


def test_digest_does_not_change_as_scenarios_are_added():
    model = _one_record_model()
    first = read_scenarios(model)[0].base_graph_digest
    add_modification_scenario(model, "t", [LocalRewriting(
        "swap", removed_nodes=(1,), added_nodes=(_relu("v0", "v1", "n1b"),))])
    assert [s.base_graph_digest for s in read_scenarios(model)] == [first, first]


def test_consumer_rewiring_becomes_explicit_replacement():
    model = _chain_model()
    # n1 is replaced by a node with a NEW output; consumers of v1 (n2) are rewired
    record = LocalRewriting("fuse", removed_nodes=(1,),
                            added_nodes=(_relu("v0", "v1_new", "n1b"),),
                            value_renames={"v1": "v1_new"})
    protos, result = normalize(model, [record])
    (proto,) = protos
    assert list(proto.removed_nodes) == [1, 2]
    assert sorted(proto.added_nodes_positions) == [1, 2]
    assert result.graph.node[2].input[0] == "v1_new" and result.graph.node[2].name == "n2"


@pytest.mark.parametrize("old, message", [
    ("y", "graph output"), ("x", "graph input"), ("w", "initializer"),
    ("v2", "node output"),  # n2 survives and still produces v2
    ("v3", "nested capture"),  # the If's branches read v3 from the outer scope
])
def test_renames_that_would_rename_are_rejected(old, message):
    model = _chain_model()
    removed = (3,) if old == "v3" else (0,)
    added = (_relu("x", "v0", "n0b"),) if old != "v3" else (_relu("v2", "v3x", "n3b"),)
    record = LocalRewriting("rename", removed_nodes=removed, added_nodes=added,
                            value_renames={old: "other"})
    with pytest.raises(ScenarioError, match=message) as err:
        normalize(model, [record])
    assert err.value.context["record"] == 0


# -- property: random valid rewrites, serialized and replayed, equal the in-memory result --

@st.composite
def _batches(draw):
    n = draw(st.integers(2, 7))
    batches = []
    size = n
    for b in range(draw(st.integers(1, 3))):
        records = []
        alive = list(range(size))
        for r in range(draw(st.integers(1, 3))):
            if not alive:
                break
            k = draw(st.integers(0, min(2, len(alive))))
            removed = draw(st.lists(st.sampled_from(alive), min_size=k, max_size=k,
                                    unique=True))
            alive = [a for a in alive if a not in removed]
            added = draw(st.integers(0 if removed else 1, 2))
            insert_at = draw(st.one_of(st.none(), st.integers(0, size)))
            records.append((b, r, tuple(removed), added, insert_at))
        batches.append(records)
        size = size + sum(a - len(rm) for _, _, rm, a, _ in records)
    return n, batches


def _reference(names: list[str], batches) -> list[str]:
    """Batch semantics by name, written independently of the normalizer."""
    current = list(names)
    for records in batches:
        origin = list(current)
        for b, r, removed, added, insert_at in records:
            gone = {origin[i] for i in removed}
            kept = [x for x in current if x not in gone]
            if insert_at is not None:  # at the slot of the first batch node >= insert_at
                later = [i for i, x in enumerate(current)
                         if x in origin and origin.index(x) >= insert_at]
                pos = (sum(1 for x in current[:later[0]] if x not in gone) if later
                       else len(kept))
            elif gone:  # where the first removed node was
                first = min(current.index(x) for x in gone)
                pos = sum(1 for x in current[:first] if x not in gone)
            else:
                pos = len(kept)
            new = [f"b{b}r{r}a{j}" for j in range(added)]
            current = kept[:pos] + new + kept[pos:]
    return current


@settings(max_examples=300, deadline=None)
@given(_batches())
def test_random_rewrites_replay_exactly(spec):
    n, batches = spec
    nodes = [helper.make_node("Relu", ["x"], [f"o{i}"], name=f"n{i}") for i in range(n)]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1])],
        [helper.make_tensor_value_info("x", F, [1])]))
    rewrites = [
        LocalRewriting("op", removed_nodes=removed,
                       added_nodes=tuple(helper.make_node("Relu", ["x"], [f"b{b}r{r}o{j}"],
                                                          name=f"b{b}r{r}a{j}")
                                         for j in range(added)),
                       insert_at=insert_at, batch=b)
        for records in batches for b, r, removed, added, insert_at in records]
    protos, in_memory = normalize(model, rewrites)
    assert _names(in_memory.graph) == _reference(_names(model.graph), batches)
    stored = onnx.ModelProto()
    stored.CopyFrom(model)

    scenario = pb.ModelModificationScenarioProto(
        scenario="p", base_graph_digest=base_graph_digest(model), digest_algorithm="blake3",
        replay_format_version=1)
    scenario.rewrites.extend(protos)
    write_scenarios(stored, [scenario])
    reparsed = onnx.ModelProto()
    reparsed.ParseFromString(stored.SerializeToString())
    replayed = replay_modification_scenario(reparsed, "p")
    assert replayed.graph.SerializeToString(deterministic=True) == \
        in_memory.graph.SerializeToString(deterministic=True)


# -- consumer rewiring within a batch, rename chains, values left without producer ---------

def _rewire_model() -> onnx.ModelProto:
    """Cast(c) -> a; Identity(a) -> b; If(b) {then: Neg(x), dead Abs(x); else: Identity(x)}."""
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg"),
                              helper.make_node("Abs", ["x"], ["u"], name="dead")],
                             "then", [], [helper.make_tensor_value_info("t", F, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="else_id")],
                              "else", [], [helper.make_tensor_value_info("e", F, [2])])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["c"], ["a"], to=TensorProto.BOOL, name="cast"),
         helper.make_node("Identity", ["a"], ["b"], name="id"),
         helper.make_node("If", ["b"], ["y"], then_branch=then, else_branch=other, name="if")],
        "g", [helper.make_tensor_value_info("x", F, [2]),
              helper.make_tensor_value_info("c", F, [])],
        [helper.make_tensor_value_info("y", F, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


_DROP_IDENTITY = LocalRewriting("drop-identity", removed_nodes=(1,), value_renames={"b": "a"})
_DEAD_IN_BRANCH = LocalRewriting("cleanup", graph_path=("2:then_branch",), removed_nodes=(1,))


def test_rewired_consumer_keeps_its_batch_identity():
    model = _rewire_model()
    # a later record of the batch enters the subgraph of the node an earlier one rewired
    protos, result = normalize(model, [_DROP_IDENTITY, _DEAD_IN_BRANCH])
    assert _names(result.graph) == ["cast", "if"]
    assert result.graph.node[1].input[0] == "a"
    then = next(a.g for a in result.graph.node[1].attribute if a.name == "then_branch")
    assert _names(then) == ["neg"]
    # sequentially, the rewired If is removed and added back at its own position
    assert list(protos[0].removed_nodes) == [1, 2]
    assert list(protos[0].added_nodes_positions) == [1]
    assert list(protos[1].graph_path) == ["1:then_branch"]
    # the other order gives the same graph
    _, reverse = normalize(model, [_DEAD_IN_BRANCH, _DROP_IDENTITY])
    assert reverse.graph.SerializeToString(deterministic=True) == \
        result.graph.SerializeToString(deterministic=True)
    # a later record of the batch removes the rewired node itself
    swap = LocalRewriting("swap-if", removed_nodes=(2,),
                          added_nodes=(helper.make_node("Identity", ["x"], ["y"], name="y"),))
    protos, result = normalize(model, [_DROP_IDENTITY, swap])
    assert _names(result.graph) == ["cast", "y"]
    assert [list(p.removed_nodes) for p in protos] == [[1, 2], [1]]
    # and an insertion anchored at the rewired node goes before it
    front = LocalRewriting("front", added_nodes=(_relu("x", "z", "z"),), insert_at=2)
    _, result = normalize(model, [_DROP_IDENTITY, front])
    assert _names(result.graph) == ["cast", "z", "if"]


def _identity_chain() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Identity", ["a"], ["b"], name="id1"),
             helper.make_node("Identity", ["b"], ["c"], name="id2"),
             helper.make_node("Neg", ["c"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("renames", [{"c": "b", "b": "a"}, {"b": "a", "c": "b"}])
def test_rename_chains_resolve_transitively(renames):
    record = LocalRewriting("drop-identities", removed_nodes=(1, 2), value_renames=renames)
    _, result = normalize(_identity_chain(), [record])
    assert [(n.name, list(n.input)) for n in result.graph.node] == [("relu", ["x"]),
                                                                   ("neg", ["a"])]
    model = _identity_chain()
    add_modification_scenario(model, "s", [record])
    assert replay_modification_scenario(model, "s").graph.node[1].input[0] == "a"


@pytest.mark.parametrize("renames", [{"b": "c", "c": "b"}, {"c": "c"}])
def test_rename_cycles_are_rejected(renames):
    record = LocalRewriting("loop", removed_nodes=(1, 2), value_renames=renames)
    with pytest.raises(ScenarioError, match="cycle") as err:
        normalize(_identity_chain(), [record])
    assert err.value.context["record"] == 0


@pytest.mark.parametrize("record, message", [
    # neg still reads c, which only the removed id2 produced
    (LocalRewriting("drop", removed_nodes=(2,)), "removed nodes produced"),
    # renamed to a value the same record removes
    (LocalRewriting("drop", removed_nodes=(1, 2), value_renames={"c": "b"}),
     "removed nodes produced"),
    # the graph output's producer goes with no replacement
    (LocalRewriting("drop", removed_nodes=(3,)), "graph output"),
])
def test_records_leaving_removed_values_unproduced_are_rejected(record, message):
    with pytest.raises(ScenarioError, match=message) as err:
        normalize(_identity_chain(), [record])
    assert err.value.context["record"] == 0


def test_removed_values_may_come_back():
    """An added node or initializer producing the removed node's output is fine."""
    model = _identity_chain()
    by_node = LocalRewriting("swap", removed_nodes=(2,),
                             added_nodes=(helper.make_node("Relu", ["b"], ["c"], name="r"),))
    by_init = LocalRewriting("fold", removed_nodes=(0,), added_initializers=(
        numpy_helper.from_array(np.ones(2, np.float32), "a"),))
    _, result = normalize(model, [by_node, by_init])
    assert _names(result.graph) == ["id1", "r", "neg"]
    # a nested capture of a removed value counts as a read
    inner = helper.make_graph([helper.make_node("Identity", ["c"], ["t"])], "t", [],
                              [helper.make_tensor_value_info("t", F, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "e", [],
                              [helper.make_tensor_value_info("e", F, [2])])
    model.graph.node.append(helper.make_node("If", ["flag"], ["z"], then_branch=inner,
                                             else_branch=other, name="if"))
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    record = LocalRewriting("drop", removed_nodes=(2, 3),
                            added_nodes=(helper.make_node("Neg", ["b"], ["y"], name="n"),))
    with pytest.raises(ScenarioError, match="removed nodes produced") as err:
        normalize(model, [record])
    assert err.value.context["node"] == "if" and err.value.context["value"] == "c"
