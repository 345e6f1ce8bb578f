"""Hostile and ambiguous inputs: refused up front with a typed error, never guessed, never
a hang, a traceback or a crash of the process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.convert import convert_to_external, convert_to_inline
from weightstore.errors import (
    ExternalDataError,
    IntegrityError,
    ModelError,
    PackageError,
    RecipeError,
)
from weightstore.io.digests import digest_bytes
from weightstore.recipe.schema import RECIPE_SIZE_LIMIT, load_recipe, parse_recipe_text
from weightstore.store import WeightStore

from .test_build import write_recipe

LAYOUT = "\n  - {name: c, external_weight: combined}\n"
MINIMAL = textwrap.dedent("""\
    package: p
    version: "1"
    models:
      - {name: m, source: m.onnx}
    layouts:
      - {name: l, external_weight: combined}
    """)


def _model(inits: list[TensorProto], *, outputs: list[str] | None = None) -> onnx.ModelProto:
    names = outputs or [t.name for t in inits]
    nodes = [helper.make_node("Identity", [n], [f"y{i}"]) for i, n in enumerate(names)]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
            for i in range(len(names))]
    graph = helper.make_graph(nodes, "g", [], outs, inits)
    return helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external(folder: Path, checksum: str | None) -> Path:
    """A model with one 4 KiB external tensor whose external data declares ``checksum``."""
    values = np.arange(1024, dtype=np.float32)
    (folder / "w.bin").write_bytes(values.tobytes())
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1024],
                    data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", "4096"),
                 *((("checksum", checksum),) if checksum else ())):
        t.external_data.add(key=k, value=v)
    path = folder / "m.onnx"
    path.write_bytes(_model([t]).SerializeToString())
    return path


# -- item 3: declared checksums ----------------------------------------------------------------

def _good_sum(algo: str) -> str:
    return f"{algo}:" + digest_bytes(algo, np.arange(1024, dtype=np.float32).tobytes())


@pytest.mark.parametrize("algo", ["blake3", "sha256"])
def test_a_wrong_declared_checksum_fails_the_build(algo, tmp_path):
    wrong = f"{algo}:" + "ab" * 32
    recipe = write_recipe(tmp_path, {"m": _external(tmp_path, wrong)}, LAYOUT)
    with pytest.raises(IntegrityError) as err:
        build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert "checksum" in err.value.message and err.value.context["tensor"].endswith("'W'")
    assert err.value.context["expected"] == wrong
    assert not (tmp_path / "out").exists()
    with pytest.raises(IntegrityError):
        convert_to_external(tmp_path / "m.onnx", tmp_path / "o.onnx", threshold=0)


@pytest.mark.parametrize("algo", ["blake3", "sha256"])
def test_a_right_declared_checksum_builds(algo, tmp_path):
    recipe = write_recipe(tmp_path, {"m": _external(tmp_path, _good_sum(algo))}, LAYOUT)
    build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert (tmp_path / "out/pkg/1.0.0/c/summary.json").is_file()


def test_checksums_are_verified_in_the_hashing_read(tmp_path, monkeypatch):
    """No extra read: every payload byte range is opened once, for hashing."""
    import weightstore.io.digests as hashing

    opened: list[str] = []
    real = hashing.open_regular
    monkeypatch.setattr(hashing, "open_regular", lambda p: opened.append(str(p)) or real(p))
    src = _external(tmp_path, _good_sum("sha256"))
    convert_to_external(src, tmp_path / "o.onnx", threshold=0)
    assert opened.count(str(tmp_path / "w.bin")) == 1


def test_unknown_checksum_forms_are_refused(tmp_path):
    """A checksum weightstore cannot verify is never ignored silently (see
    test_external_data_entries for every form)."""
    recipe = write_recipe(tmp_path, {"m": _external(tmp_path, "md5:0123")}, LAYOUT)
    with pytest.raises(ExternalDataError) as err:
        build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert err.value.context["key"] == "checksum"
    assert err.value.context["value"] == "md5:0123"


INLINE_LAYOUTS = {
    "embedded": "\n  - {name: c, external_weight: embedded}\n",
    "below-threshold": "\n  - {name: c, external_weight: combined, size_threshold: 65536}\n",
}


@pytest.mark.parametrize("layout", sorted(INLINE_LAYOUTS))
@pytest.mark.parametrize("algo", ["blake3", "sha256"])
def test_a_wrong_declared_checksum_fails_a_payload_packaged_inline(algo, layout, tmp_path):
    """The payload is read to be put inline (an embedded layout, or below the size
    threshold): its declared checksum is verified on that read, naming the tensor."""
    wrong = f"{algo}:" + "ab" * 32
    recipe = write_recipe(tmp_path, {"m": _external(tmp_path, wrong)}, INLINE_LAYOUTS[layout])
    with pytest.raises(IntegrityError) as err:
        build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert "checksum" in err.value.message and err.value.context["tensor"].endswith("'W'")
    assert err.value.context["expected"] == wrong
    assert not (tmp_path / "out/pkg/1.0.0/c").exists()
    with pytest.raises(IntegrityError):
        convert_to_external(tmp_path / "m.onnx", tmp_path / "o.onnx", threshold=1 << 20)


@pytest.mark.parametrize("layout", sorted(INLINE_LAYOUTS))
def test_a_right_declared_checksum_is_verified_in_the_one_read(layout, tmp_path,
                                                                monkeypatch):
    import weightstore.convert.weights as weights

    reads: list[str] = []
    real = weights.read_payload
    monkeypatch.setattr(weights, "read_payload",
                        lambda d, c=None: reads.append(str(d.file)) or real(d, c))
    recipe = write_recipe(tmp_path, {"m": _external(tmp_path, _good_sum("sha256"))},
                          INLINE_LAYOUTS[layout])
    build(recipe, BuildOptions(store=str(tmp_path / "store"), jobs=1))
    assert reads.count(str(tmp_path / "w.bin")) == 1
    model = onnx.load(str(tmp_path / "out/pkg/1.0.0/c/m.onnx"))
    assert model.graph.initializer[0].raw_data == np.arange(1024, dtype=np.float32).tobytes()


# -- item 4: ambiguous models ------------------------------------------------------------------

@pytest.mark.parametrize("location", ["EXTERNAL", "DEFAULT"])
def test_inline_and_external_data_at_once_is_refused(tmp_path, location):
    """Inline bytes beside external_data entries are ambiguous whether or not the writer
    set data_location to EXTERNAL."""
    src = _external(tmp_path, None)
    model = onnx.load(str(src), load_external_data=False)
    model.graph.initializer[0].raw_data = np.ones(1024, dtype=np.float32).tobytes()
    model.graph.initializer[0].data_location = getattr(onnx.TensorProto, location)
    src.write_bytes(model.SerializeToString())
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    for action in (lambda: build(recipe, BuildOptions(store=str(tmp_path / "store"))),
                   lambda: convert_to_external(src, tmp_path / "o.onnx", threshold=0),
                   lambda: convert_to_inline(src, tmp_path / "i.onnx")):
        with pytest.raises(ModelError, match="both inline and as external") as err:
            action()
        assert "'W'" in err.value.context["where"]
    assert not (tmp_path / "store").exists()


def test_a_constant_with_typed_values_and_stray_external_entries_is_refused(tmp_path):
    """The same ambiguity where exporters keep weights: a Constant node's value, its
    numbers in a typed field (float_data), with external_data entries beside them and
    data_location left at DEFAULT."""
    (tmp_path / "w.bin").write_bytes(np.zeros(300, np.float32).tobytes())
    value = numpy_helper.from_array(np.ones(300, np.float32), "")
    value.float_data.extend(np.ones(300, np.float32).tolist())
    value.ClearField("raw_data")
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", "1200")):
        value.external_data.add(key=k, value=v)
    node = helper.make_node("Constant", [], ["W"], value=value)
    graph = helper.make_graph([node], "g", [],
                              [helper.make_tensor_value_info("W", TensorProto.FLOAT, [300])])
    src = tmp_path / "m.onnx"
    src.write_bytes(helper.make_model_gen_version(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    for action in (lambda: build(recipe, BuildOptions(store=str(tmp_path / "store"))),
                   lambda: convert_to_inline(src, tmp_path / "i.onnx")):
        with pytest.raises(ModelError, match="both inline and as external") as err:
            action()
        assert err.value.context["where"] == "graph 'g' node 0 (Constant '')"
        assert err.value.context["data_location"] == "DEFAULT"
    assert not (tmp_path / "store").exists()


def test_duplicate_initializer_names_are_refused(tmp_path):
    a = numpy_helper.from_array(np.zeros(300, dtype=np.float32), "W")
    b = numpy_helper.from_array(np.ones(300, dtype=np.float32), "W")
    src = tmp_path / "m.onnx"
    src.write_bytes(_model([a, b], outputs=["W"]).SerializeToString())
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    with pytest.raises(ModelError, match="share a name") as err:
        build(recipe, BuildOptions(store=str(tmp_path / "store")))
    assert err.value.context["initializer"] == "W"
    with pytest.raises(ModelError, match="share a name"):
        convert_to_inline(src, tmp_path / "i.onnx")


# -- item 5: no hangs, no tracebacks -------------------------------------------------------------

def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightstore", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def _one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("weightstore: error: "), res.stderr
    for n in needles:
        assert n in lines[0], res.stderr


@pytest.mark.parametrize(("data_type", "values", "bad", "name"), [
    (TensorProto.UINT8, 2, 300, "UINT8"),  # small: a metadata value, kept whole
    (TensorProto.UINT8, 6000, 300, "UINT8"),  # above the metadata limit, below the threshold
    (TensorProto.FLOAT16, 2, -1, "FLOAT16"),
    (TensorProto.BOOL, 2, 2, "BOOL"),
])
def test_a_typed_value_its_type_cannot_hold_fails_though_it_stays_inline(
        tmp_path, capsys, data_type, values, bad, name):
    """onnxruntime would keep the low bits: refused by build and run alike, whether the
    tensor moves out (``size_threshold``) or not."""
    weight = helper.make_tensor("W", data_type, [values], [0] * values)
    weight.int32_data[0] = bad
    elem = TensorProto.UINT8 if data_type == TensorProto.UINT8 else data_type
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", elem, [values])], [weight])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model_gen_version(
        graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    np.savez(tmp_path / "in.npz")
    recipe = write_recipe(tmp_path, {"m": model},
                          "\n  - {name: c, external_weight: combined, "
                          "size_threshold: 1048576}\n")
    for argv in (["build", str(recipe), "--store", str(tmp_path / "s")],
                 ["run", str(model), "--inputs", str(tmp_path / "in.npz")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"weightstore: error: int32_data holds a value outside {name}'s "
                              "range (") and err.count("\n") == 1, err
        assert re.search(f"(tensor=graph 'g' initializer 'W'|where=W), value={bad}\\)",
                         err), err
    graph.initializer[0].int32_data[0] = 1  # the same model, every value in range
    onnx.save(helper.make_model_gen_version(
        graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    assert main(["-q", "build", str(recipe), "--store", str(tmp_path / "s")]) == 0
    assert main(["-q", "run", str(model), "--inputs", str(tmp_path / "in.npz")]) == 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_no_output_option_replaces_a_fifo_or_a_device(encoder_model, save_model, tmp_path,
                                                      capsys):
    """Every ``--output`` (and convert's output) is a new path or a regular file: a FIFO,
    or a link to a device node, is refused before the work, left as it was."""
    import stat

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model_gen_version(
        graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    np.savez(tmp_path / "in.npz", x=np.zeros(2, np.float32))
    store = tmp_path / "s"
    recipe = write_recipe(tmp_path, {"e": save_model(encoder_model, "e.onnx")}, LAYOUT)
    assert main(["-q", "build", str(recipe), "--store", str(store)]) == 0
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    device = tmp_path / "null"  # a link to a device node: the node itself is never touched
    device.symlink_to(os.devnull)
    for target, kind in ((fifo, "a FIFO"), (device, "a device")):
        for argv in (["run", str(model), "--inputs", str(tmp_path / "in.npz"), "--output"],
                     ["report", "--store", str(store), "--output"],
                     ["store", "export-meta", "--store", str(store), "--output"],
                     ["schema", "--output"],
                     ["convert", "to-external", str(model)],
                     ["scenario", "add", str(model), "s", "--passes", "cleanup", "--output"]):
            assert main([*argv, str(target)]) == 2, argv
            assert capsys.readouterr().err == (
                f"weightstore: error: output path is not a regular file but {kind}; only a "
                f"regular file or a new path is written (output={target})\n"), argv
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and device.is_symlink()
    regular = tmp_path / "schema.json"
    regular.write_text("old")
    assert main(["schema", "--output", str(regular)]) == 0
    assert regular.read_text().startswith("{")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    _one_line_error(_cli("inspect", str(fifo), timeout=30), "not a regular file", str(fifo))
    _one_line_error(_cli("convert", "to-inline", str(fifo), str(tmp_path / "o.onnx"),
                         timeout=30), "not a regular file")
    recipe = tmp_path / "r.yaml"
    os.mkfifo(recipe)
    _one_line_error(_cli("build", str(recipe), "--store", str(tmp_path / "s"), timeout=30),
                    "not a regular file")


@pytest.mark.parametrize("replacement", ["folder", "device"])
def test_a_source_replaced_after_a_build_is_refused_as_on_a_first_build(
        encoder_model, save_model, tmp_path, capsys, replacement):
    """The up-to-date check (build stamp, package summary) only asks whether a source
    changed; a source it cannot hash is reported by the build, in the build's words."""
    if replacement == "device" and not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    store = str(tmp_path / "store")
    assert main(["build", str(recipe), "--store", store]) == 0
    capsys.readouterr()
    src.unlink()
    if replacement == "folder":
        src.mkdir()
        expected = "model path is a folder"
    else:
        src.symlink_to("/dev/null")
        expected = "model path is not a regular file"
    assert main(["build", str(recipe), "--store", store]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and f"file={src}" in err, err


def test_a_character_device_is_refused(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with pytest.raises(ModelError, match="not a regular file"):
        convert_to_inline("/dev/zero", tmp_path / "o.onnx")
    with pytest.raises(RecipeError, match="not a regular file"):
        load_recipe("/dev/zero")


def test_recipe_size_is_capped(tmp_path):
    big = tmp_path / "r.yaml"
    big.write_text(MINIMAL + "# " + "x" * RECIPE_SIZE_LIMIT + "\n")
    with pytest.raises(RecipeError, match="larger than"):
        load_recipe(big)
    with pytest.raises(RecipeError, match="larger than"):
        parse_recipe_text(big.read_text(), "r.yaml")


@pytest.mark.parametrize(("argv", "name"), [
    (["build", "bad\0recipe.yaml"], "recipe"),
    (["build", "r.yaml", "--store", "/x\0y"], "--store"),
    (["convert", "to-inline", "m\0.onnx", "o.onnx"], "input"),
    (["schema", "--output=s\0.json"], "--output"),
    (["store", "export-meta", "--output", "m\0.json"], "--output"),
    (["unpack", "a\0.tar.zst", "out"], "archive"),
    (["convert", "to-inline", "m.onnx", "o.onnx", "--value-bins", "a=/x\0"],
     "--value-bins"),
])
def test_nul_in_paths_is_a_one_line_error(tmp_path, capsys, monkeypatch, argv, name):
    """Every argument, whichever command takes it, before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"weightstore: error: argument {name}: contains a NUL byte")
    assert len(err.splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["models[0].source", "output", "store.path"])
def test_nul_in_a_recipe_path_names_its_key(tmp_path, capsys, where):
    """A NUL in a path the recipe gives is refused with its file, line and key, before
    any file or store is touched (it used to end in a bare "embedded null byte")."""
    src = tmp_path / "m.onnx"
    src.write_bytes(_model([numpy_helper.from_array(np.zeros(4, np.float32), "W")],
                           outputs=["W"]).SerializeToString())
    fields = {"models[0].source": '"m.onnx"', "output": '"out"', "store.path": '"store"'}
    fields[where] = fields[where][:-1] + '\\0x"'
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        'package: p\nversion: "1"\n'
        f"store: {{path: {fields['store.path']}}}\n"
        f"models:\n  - {{name: m, source: {fields['models[0].source']}}}\n"
        "layouts: [{name: c, external_weight: combined}]\n"
        f"output: {fields['output']}\n")
    assert main(["build", str(recipe), "--json"]) == 2
    doc = json.loads(capsys.readouterr().err)
    assert "NUL" in doc["error"] and doc["context"]["key"] == where
    assert doc["context"]["line"] in (3, 5, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "r.yaml"]


def test_model_metadata_nested_too_deep_is_malformed(tmp_path):
    """JSON that weightstore keeps in a model's metadata (inline encodings, derivation
    and requirement records) is read from a model that may be hostile: a value nested
    past the parser's depth is a typed error, not a RecursionError."""
    from weightstore._proto import weightstore_pb2 as pb
    from weightstore.catalogue.descriptors import DerivedWeightRecipe
    from weightstore.errors import ConversionError, ScenarioError
    from weightstore.passes.rewriting import DERIVATION_PREFIX, derivations_of
    from weightstore.scenarios.derive import compute
    from weightstore.scenarios.package import _requires_of

    deep = "[" * 100_000 + "]" * 100_000
    model = _model([numpy_helper.from_array(np.zeros(4, np.float32), "W")], outputs=["W"])
    model.metadata_props.add(key="weightstore.inline_encodings", value=deep)
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    with pytest.raises(ConversionError, match="malformed metadata"):
        convert_to_inline(src, tmp_path / "o.onnx")
    record = pb.LocalRewritingProto()
    record.metadata_props.add(key=DERIVATION_PREFIX + "w", value=deep)
    with pytest.raises(ScenarioError, match="malformed derivation"):
        derivations_of(record)
    scenario = pb.ModelModificationScenarioProto(scenario="s")
    scenario.metadata_props.add(key="weightstore.requires", value=deep)
    with pytest.raises(ScenarioError, match="malformed scenario requirements"):
        _requires_of(scenario)
    recipe = DerivedWeightRecipe("transpose", ("W",), (("perm", deep),))
    with pytest.raises(ScenarioError, match="perm"):
        compute(recipe, [np.zeros((2, 3), np.float32)])


def test_an_output_summary_nested_too_deep_is_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(_model([numpy_helper.from_array(np.zeros(4, np.float32), "W")],
                           outputs=["W"]).SerializeToString())
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    folder = tmp_path / "out" / "pkg" / "1.0.0" / "c"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["build", str(recipe), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a package" in err


# -- item 7: bounded inputs ----------------------------------------------------------------------

def test_yaml_alias_bomb_is_refused_small_and_fast():
    bomb = MINIMAL + textwrap.dedent("""\
        devices:
          - name: d
            capabilities:
              a: &a [x, x, x, x, x, x, x, x, x]
              b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
              c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
              d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
              e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
              f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
              g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
              h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
              i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
        """)
    assert len(bomb) < 1000
    with pytest.raises(RecipeError, match="aliases"):
        parse_recipe_text(bomb, "r.yaml")


@pytest.mark.parametrize(("value", "key"), [("&c {a: *c}", "a"), ("&c [1, *c]", "[1]"),
                                            ("&c {a: [{b: *c}]}", "a[0].b")])
def test_an_alias_inside_its_own_anchor_is_refused_at_the_alias(value, key):
    """A value that contains itself: a free-form field would take it in (and the build fail
    far from the recipe, without a line); refused while parsing, at the alias."""
    text = MINIMAL + f"devices:\n  - name: d\n    capabilities: {value}\n"
    with pytest.raises(RecipeError, match="contains itself through an alias") as err:
        parse_recipe_text(text, "r.yaml")
    assert err.value.context["line"] == text.count("\n")
    assert err.value.context["key"] == "devices[0].capabilities" + ("." + key).replace(".[", "[")


def test_a_number_of_thousands_of_digits_is_a_recipe_error():
    text = MINIMAL + "devices:\n  - name: d\n    capabilities: {n: " + "9" * 5000 + "}\n"
    with pytest.raises(RecipeError, match="more than 64 digits") as err:
        parse_recipe_text(text, "r.yaml")
    assert err.value.context["line"] == text.count("\n")


def test_anchors_reused_without_recursion_still_parse():
    text = MINIMAL + "devices:\n  - {name: d, capabilities: &c {a: 1}}\n" \
        "  - {name: e, capabilities: {<<: *c, b: [*c, *c]}}\n"
    recipe = parse_recipe_text(text, "r.yaml")
    assert recipe.devices[1].capabilities == {"a": 1, "b": [{"a": 1}, {"a": 1}]}


TRUNCATE_WHILE_HASHING = """
import os, sys
from weightstore.io import digests as hashing
from weightstore.errors import IntegrityError
path = sys.argv[1]
real = hashing.new_hasher
class Shrinking:
    def __init__(self, algo):
        self.inner, self.done = real(algo), False
    def update(self, data):
        if not self.done:  # another process cuts the file short mid-read
            os.truncate(path, 4096)
            self.done = True
        self.inner.update(data)
        # touch every byte handed over, as a hasher reading a mapped window would
        bytes(data)
    def hexdigest(self):
        return self.inner.hexdigest()
hashing.new_hasher = Shrinking
try:
    hashing.digest_file("blake3", path)
except IntegrityError as exc:
    print("refused:", exc)
"""


def test_a_source_truncated_while_hashed_is_an_error_not_sigbus(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(24 << 20))
    res = subprocess.run([sys.executable, "-c", TRUNCATE_WHILE_HASHING, str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, f"killed by signal {-res.returncode}: {res.stderr}"
    assert res.stdout.startswith("refused: file became shorter"), res.stdout + res.stderr
    assert str(path) in res.stdout


# -- item 9: outputs checked before the store is touched -----------------------------------------

def test_output_through_a_file_is_refused_before_the_store(encoder_model, save_model,
                                                            tmp_path):
    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    (tmp_path / "out").write_text("a file where the output folder should be")
    store = tmp_path / "store"
    with pytest.raises(PackageError, match="not a folder") as err:
        build(recipe, BuildOptions(store=str(store)))
    assert err.value.context["blocked_by"] == str(tmp_path / "out")
    assert not store.exists()


def test_an_output_folder_not_writable_is_refused_before_the_store(
        encoder_model, save_model, tmp_path, monkeypatch):
    """As another user would find it (the suite runs as root, who may write anywhere, so
    the permission check itself is told "no")."""
    import weightstore.io.files as outputs

    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, LAYOUT)
    (tmp_path / "out").mkdir()
    real = os.access
    monkeypatch.setattr(outputs.os, "access", lambda p, mode: (
        Path(p) != tmp_path / "out" and real(p, mode)))
    store = tmp_path / "store"
    with pytest.raises(PackageError, match="not writable") as err:
        build(recipe, BuildOptions(store=str(store)))
    assert err.value.context["not_writable"] == str(tmp_path / "out")
    assert not store.exists()



def test_io_errors_name_their_path(tmp_path, monkeypatch):
    import errno

    from weightstore.io import files as fsio

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsio.os, "fsync", full)
    target = tmp_path / "out.bin"
    with pytest.raises(OSError) as err:
        fsio.atomic_write_bytes(target, b"x")
    assert err.value.filename == str(target)
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_a_full_disk_while_packaging_names_the_package_file(encoder_model, save_model,
                                                             tmp_path, monkeypatch, capsys):
    import errno

    import weightstore.layout.writer as writer

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "copy_range", full)
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")}, LAYOUT)
    assert main(["build", str(recipe), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weightstore: error: No space left on device: ")
    assert "m_weight_combined" in err and str(tmp_path / "out") in err


def _built_store(encoder_model, save_model, tmp_path):
    layout = "\n  - {name: s, external_weight: separate}\n"
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")}, layout)
    store = tmp_path / "store"
    build(recipe, BuildOptions(store=str(store)))
    victim = max(store.glob("weight_*"), key=lambda p: p.stat().st_size)
    return recipe, store, victim


def test_a_symlinked_store_object_is_damage(encoder_model, save_model, tmp_path):
    recipe, store, victim = _built_store(encoder_model, save_model, tmp_path)
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(victim.read_bytes())  # even with the very same bytes
    victim.unlink()
    victim.symlink_to(elsewhere)
    # damage: the build writes the object again, as a regular file, from its source
    build(recipe, BuildOptions(store=str(store), force=True))
    assert not victim.is_symlink() and victim.read_bytes() == elsewhere.read_bytes()
    assert WeightStore(store).verify().ok


def _temps(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name.endswith(".tmp"))


def test_a_store_object_replaced_by_a_folder_is_damage(encoder_model, save_model, tmp_path):
    """A folder where a per-weight object belongs: the build writes the object again from
    its source (an empty folder is removed for it), and leaves no temp file; repair
    removes an empty one too, so the next build writes the object."""
    recipe, store, victim = _built_store(encoder_model, save_model, tmp_path)
    data = victim.read_bytes()
    victim.unlink()
    victim.mkdir()
    build(recipe, BuildOptions(store=str(store), force=True))
    assert victim.is_file() and victim.read_bytes() == data and _temps(store) == []
    assert WeightStore(store).verify().ok
    victim.unlink()
    victim.mkdir()
    res = _cli("store", "verify", "--repair", "--store", str(store), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not victim.exists()
    build(recipe, BuildOptions(store=str(store), force=True))
    assert victim.read_bytes() == data and WeightStore(store).verify().ok


def test_a_folder_with_content_where_an_object_belongs_is_never_deleted(
        encoder_model, save_model, tmp_path):
    """What a folder holds may be anyone's: the build stops with one line naming it, its
    content untouched and no temp file left; repair leaves it too."""
    recipe, store, victim = _built_store(encoder_model, save_model, tmp_path)
    victim.unlink()
    victim.mkdir()
    (victim / "notes.txt").write_text("mine")
    res = _cli("build", str(recipe), "--store", str(store), "--force", timeout=60)
    _one_line_error(res, "not empty stands where a store object belongs", str(victim))
    assert (victim / "notes.txt").read_text() == "mine" and _temps(store) == []
    res = _cli("store", "verify", "--repair", "--store", str(store), timeout=60)
    assert (victim / "notes.txt").read_text() == "mine"


def test_a_damaged_store_object_names_its_file_offset_and_the_repair(
        encoder_model, save_model, tmp_path, monkeypatch):
    import shutil

    recipe, store, victim = _built_store(encoder_model, save_model, tmp_path)
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0xFF
    victim.write_bytes(bytes(data))
    shutil.rmtree(store / "payload-keys")  # no cache: the payload is copied from the store
    # The build has the source's bytes at hand: it rewrites the object and goes on.
    build(recipe, BuildOptions(store=str(store), force=True))
    assert WeightStore(store).verify().ok
    # Without a good copy, the error names the store file, offset and the repair.
    victim.write_bytes(bytes(data))
    shutil.rmtree(store / "payload-keys")
    import weightstore.packaging.write as packaging

    monkeypatch.setattr(packaging, "heal", lambda *args: None)
    with pytest.raises(IntegrityError, match="does not match its digest") as err:
        build(recipe, BuildOptions(store=str(store), force=True))
    assert err.value.context["source"] == str(victim)
    assert err.value.context["source_offset"] == 0
    assert "store verify --repair" in err.value.context["hint"]


@pytest.mark.parametrize(("column", "value"), [
    ("offset", 1e30), ("offset", 1.5), ("offset", "abc"), ("offset", -1), ("size", "x"),
    ("file", "weight_\x00")])
def test_a_malformed_index_row_is_damage_never_a_traceback(
        encoder_model, save_model, tmp_path, capsys, column, value):
    import sqlite3

    recipe, store, victim = _built_store(encoder_model, save_model, tmp_path)
    conn = sqlite3.connect(store / "index.sqlite")
    conn.execute(f"UPDATE objects SET {column} = ? WHERE file = ?", (value, victim.name))
    conn.commit()
    conn.close()
    assert main(["store", "verify", "--store", str(store)]) != 0
    assert "malformed_row" in capsys.readouterr().out
    # a build treats the object as absent and writes it again from its source
    assert main(["build", str(recipe), "--store", str(store), "--force"]) == 0
    assert WeightStore(store).verify().ok
    conn = sqlite3.connect(store / "index.sqlite")
    conn.execute(f"UPDATE objects SET {column} = ? WHERE file = ?", (value, victim.name))
    conn.commit()
    conn.close()
    assert main(["store", "verify", "--repair", "--store", str(store)]) == 0
    assert WeightStore(store).verify().ok


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("layout", ["separate", "combined"])
def test_a_store_object_replaced_by_a_fifo_is_damage_never_a_hang(
        encoder_model, save_model, tmp_path, layout):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          f"\n  - {{name: l, external_weight: {layout}}}\n")
    store = tmp_path / "store"
    build(recipe, BuildOptions(store=str(store)))
    victim = max((p for p in store.iterdir() if p.name.startswith("weight_")
                  or p.name.endswith("_weight_combined")), key=lambda p: p.stat().st_size)
    victim.unlink()
    os.mkfifo(victim)
    # the build has the sources: the objects are written again (a combined file's to a
    # sibling: nothing is appended to what is not a regular file)
    res = _cli("build", str(recipe), "--store", str(store), "--force", timeout=60)
    assert res.returncode == 0, res.stderr
    assert WeightStore(store).verify().ok
    # without a source at hand: the store's readers refuse it as damage, naming it
    s = WeightStore(store)
    obj = max(s.objects(), key=lambda o: o.size)
    victim = store / obj.file
    victim.unlink()
    os.mkfifo(victim)
    with pytest.raises(IntegrityError, match="not a regular file") as err:
        s.read(obj)
    assert err.value.context["path"] == str(victim)
    assert err.value.context["hint"] == "run 'weightstore store verify --repair'"
    from weightstore.load.reader import FileReader

    with pytest.raises(IntegrityError, match="not a regular file") as err:
        FileReader().read_into(victim, 0, memoryview(bytearray(1)))
    assert err.value.context["hint"] == "run 'weightstore store verify --repair'"
    res = _cli("store", "verify", "--repair", "--store", str(store), timeout=60)
    assert res.returncode == 0, res.stderr
    res = _cli("build", str(recipe), "--store", str(store), "--force", timeout=60)
    assert res.returncode == 0, res.stderr
    assert WeightStore(store).verify().ok


@pytest.mark.parametrize("layout", ["separate", "combined"])
def test_a_full_disk_while_storing_names_the_store_file(encoder_model, save_model, tmp_path,
                                                        monkeypatch, capsys, layout):
    import errno

    import weightstore.store.writer as store_writer

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_writer, "copy_range", full)
    monkeypatch.setattr(store_writer, "write_all", full)
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          f"\n  - {{name: l, external_weight: {layout}}}\n")
    store = tmp_path / "store"
    assert main(["build", str(recipe), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"weightstore: error: No space left on device: {store}/")
    name = "m_weight_combined" if layout == "combined" else "weight_"
    assert name in err[0]


def test_every_json_read_refuses_deep_nesting_as_malformed_input():
    """json.loads raises RecursionError on a document nested deeper than it follows; every
    reader of a file or an answer goes through ``parse_json``, which makes that the
    ValueError its callers already turn into their typed error."""
    import ast

    import weightstore
    from weightstore.io.files import parse_json

    root = Path(weightstore.__file__).parent
    direct = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("loads", "load")
                    and isinstance(node.value, ast.Name) and node.value.id == "json"):
                direct.append(path.relative_to(root).as_posix())
    assert direct == ["io/files.py"]  # parse_json itself
    with pytest.raises(ValueError, match="nested too deep"):
        parse_json("[" * 100_000 + "]" * 100_000)
