"""Start-up cost: each command imports only what it needs (checked in a fresh process)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from .helpers import TWO_LAYOUTS
from .registry_server import needs_registry, running_registry

HEAVY = ("numpy", "onnx", "pydantic", "yaml", "google.protobuf", "onnxruntime", "requests",
         "urllib3")


def _imported(argv: list[str], cwd: Path, modules: tuple[str, ...] = HEAVY) -> set[str]:
    """Which of ``modules`` (default: the heavy ones) a ``weightstore`` command loads (its
    exit code is not judged)."""
    code = ("import sys, io, contextlib\n"
            "from weightstore.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit:\n"
            "        pass\n"
            f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", "import json\n" + code], cwd=cwd,
                          capture_output=True, text=True, check=True, env=os.environ.copy())
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _succeeds(argv: list[str], folder: Path, modules: tuple[str, ...]) -> tuple[str, list[str]]:
    """A ``weightstore`` command that must succeed, in a fresh process: what it printed,
    and which of ``modules`` it loaded."""
    return _fresh(f"with contextlib.redirect_stdout(io.StringIO()) as out:\n"
                  f"    assert main({argv!r}) == 0\n", folder, modules)


def _fresh(code: str, folder: Path, modules: tuple[str, ...]) -> tuple[str, list[str]]:
    """``code`` (with ``main``, ``weightstore``, ``io`` and ``contextlib`` at hand; what it
    leaves in ``out`` is returned) in a fresh process, and which of ``modules`` it loaded."""
    code = ("import sys, io, contextlib, json\n"
            "import weightstore\n"
            "from weightstore.cli import main\n"
            "out = io.StringIO()\n"
            f"{code}"
            "print(json.dumps(out.getvalue()))\n"
            f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                          text=True, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    printed, loaded = done.stdout.strip().splitlines()[-2:]
    return json.loads(printed), json.loads(loaded)


def _build_imports(folder: Path, modules: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``build recipe.yaml`` in a fresh process: its packages' statuses, and which of
    ``modules`` it loaded."""
    out, loaded = _succeeds(["build", "recipe.yaml", "--json"], folder, modules)
    return [p["status"] for p in json.loads(out)["packages"]], loaded


@pytest.fixture
def folder(tmp_path: Path, encoder_model: onnx.ModelProto) -> Path:
    onnx.save(encoder_model, tmp_path / "model.onnx")
    return tmp_path


@pytest.mark.parametrize(("argv", "allowed"), [
    (["--version"], set()),
    (["--help"], set()),
    (["push", "--help"], set()),
    (["pull", "--help"], set()),
    (["store", "stats", "--store", "nowhere"], set()),
    (["inspect", "model.onnx"], {"numpy", "google.protobuf"}),
    (["scenario", "list", "model.onnx"], {"numpy", "google.protobuf"}),
])
def test_command_imports_only_what_it_needs(folder: Path, argv: list[str],
                                            allowed: set[str]) -> None:
    assert _imported(argv, folder) <= allowed


def test_a_cold_build_into_external_data_imports_neither_onnx_nor_numpy(folder: Path,
                                                                        ) -> None:
    """onnx's initialiser (its C++ extension, numpy, ml_dtypes) costs more than converting a
    mid-size model: a build needs only onnx's message classes (weightstore.io.onnx_proto),
    and typed fields (``int64_data`` of exporters' Constant nodes) narrow with ``array``."""
    model = onnx.load(str(folder / "model.onnx"))
    assert any(n.op_type == "Constant" and n.attribute[0].t.int64_data
               for n in model.graph.node)  # a typed field is decoded
    (folder / "recipe.yaml").write_text(TWO_LAYOUTS)
    statuses, loaded = _build_imports(folder, ("onnx", "numpy", "ml_dtypes", "onnxruntime"))
    assert statuses == ["built", "built"]
    assert loaded == []
    package = folder / "out" / "pkg" / "1.0.0"
    for layout in ("combined", "per-weight"):  # what it wrote is a model onnx accepts
        onnx.checker.check_model(str(package / layout / "encoder.onnx"))


ONNX_INITIALISER = ("onnx", "ml_dtypes", "onnx.helper", "onnx.numpy_helper")

INT4 = """\
package: pkg
version: "1.0.0"
models:
  - name: encoder
    source: model.onnx
    scenarios:
      - name: int4
        passes: [{name: quantize-weights, bits: 4, block_size: 32, symmetric: true,
                  accuracy_level: 4}]
layouts:
  - {name: combined, external_weight: combined}
devices:
  - {name: cpu}
  - {name: cpu-int4, scenario: int4}
output: out
"""


def test_a_cold_build_with_an_int4_scenario_does_not_run_onnx_initialiser(folder: Path,
                                                                           ) -> None:
    """A quantizing build needs onnx's message classes, its C++ checker and shape
    inference, numpy and onnxruntime's kernels; onnx's package initialiser (ml_dtypes,
    half a second and more) is none of these. The package it writes is what onnx and
    onnxruntime accept."""
    (folder / "recipe.yaml").write_text(INT4)
    statuses, loaded = _build_imports(folder, (*ONNX_INITIALISER, "onnxruntime.quantization"))
    assert statuses == ["built"]
    assert loaded == []
    package = folder / "out" / "pkg" / "1.0.0" / "combined"
    onnx.checker.check_model(str(package / "encoder.onnx"))
    summary = json.loads((package / "summary.json").read_text())
    assert [d["scenario"] for d in summary["devices"]] == [None, "int4"]


# the int4 package, with a float16 device too
DEVICES = INT4.replace("    scenarios:\n", "    scenarios:\n"
                       "      - {name: half, passes: [cast-fp16, cleanup]}\n").replace(
    "  - {name: cpu}\n", "  - {name: cpu}\n  - {name: npu, scenario: half}\n")


@pytest.fixture
def devices(folder: Path, encoder_model: onnx.ModelProto) -> Path:
    """A package of three devices (the default graph, a float16 scenario, an int4 one),
    and sample inputs beside it."""
    import numpy as np

    from weightstore.builder.run import build

    from .samples import sample_inputs

    (folder / "recipe.yaml").write_text(DEVICES)
    np.savez(folder / "inputs.npz", **sample_inputs(encoder_model, seed=3))
    return build(folder / "recipe.yaml").packages[0].path


def test_resolve_bundle_prepare_and_run_do_not_run_onnx_initialiser(folder: Path,
                                                                     devices: Path) -> None:
    """The deploy side reads metadata, replays scenarios (float16 casts, int4 blocks),
    writes device folders and hands onnxruntime serialized models: onnx's message classes,
    its C++ extension and numpy are all it needs, never onnx's initialiser (ml_dtypes, half
    a second and more)."""
    package = str(devices)
    for argv in (["resolve", package, "--json"], ["resolve", "model.onnx", "--json"],
                 *(["resolve", package, "--device", d, "--json"] for d in ("npu", "cpu-int4")),
                 ["check", package, "--device", "npu", "--verify"],
                 ["bundle", package, "npu", "--output", "npu"],
                 ["bundle", package, "cpu-int4", "--output", "int4"],
                 ["resolve", "int4", "--json"],
                 ["prepare", package, "--device", "cpu"],
                 *(["run", package, "--device", d, "--inputs", "inputs.npz", "--output",
                    f"{d}.npz"] for d in ("cpu", "npu", "cpu-int4")),
                 ["run", "npu", "--inputs", "inputs.npz"]):
        assert _succeeds(argv, folder, ONNX_INITIALISER)[1] == [], argv
    assert sorted(p.name for p in folder.glob("*.npz")) == ["cpu-int4.npz", "cpu.npz",
                                                            "inputs.npz", "npu.npz"]


def test_weightstore_load_does_not_run_onnx_initialiser(folder: Path, devices: Path) -> None:
    """``weightstore.load`` of each device, in place (its recorded plan the second time),
    through private files, and from prepared weights, imports no more of onnx than its
    messages and extension."""
    _succeeds(["prepare", str(devices), "--device", "cpu"], folder, ())  # it asserts
    code = ("import numpy as np\n"
            "inputs = dict(np.load('inputs.npz'))\n"
            "for device in ('cpu', 'npu', 'cpu-int4'):\n"
            "    for in_place in (True, True, False):\n"
            f"        resolved = weightstore.resolve({str(devices)!r}, device=device)\n"
            "        session = weightstore.load(resolved, in_place=in_place)\n"
            "        outputs = session.run(None, inputs)\n"
            "        out.write(f'{device} {outputs[0].shape}\\n')\n")
    printed, loaded = _fresh(code, folder, ONNX_INITIALISER)
    assert loaded == []
    assert printed.splitlines() == [f"{d} (2, 8, 64)" for d in ("cpu", "npu", "cpu-int4")
                                    for _ in range(3)]


def test_a_file_constant_package_loads_without_onnx_initialiser(folder: Path) -> None:
    """GE's form (FileConstant nodes) is read through onnx's messages too: its nodes'
    attributes, and the Constants they become for onnxruntime."""
    from .helpers import file_constant_package

    version = file_constant_package(folder, folder / "model.onnx")
    code = ("for layout in ('ge', 'ge-separate'):\n"
            f"    resolved = weightstore.resolve({str(version)!r} + '/' + layout, device='npu')\n"
            "    session = weightstore.load(resolved)\n"
            "    out.write(f'{layout} {len(session.get_outputs())}\\n')\n")
    printed, loaded = _fresh(code, folder, ONNX_INITIALISER)
    assert loaded == []
    assert printed.splitlines() == ["ge 2", "ge-separate 2"]


def test_inspect_scenario_and_convert_do_not_run_onnx_initialiser(folder: Path) -> None:
    """Inspecting a model, listing, showing, adding and removing its scenarios and
    converting it between its forms read and write onnx's messages and arrays of numpy's
    own types: onnx's initialiser (ml_dtypes, half a second and more) is none of these."""
    (folder / "ge").mkdir()
    for argv in (["inspect", "model.onnx"], ["inspect", "model.onnx", "--json"],
                 ["convert", "to-file-constant", "model.onnx", "ge/ge.onnx", "--threshold",
                  "0"],
                 ["inspect", "ge/ge.onnx"],
                 ["convert", "to-inline", "ge/ge.onnx", "ge-inline.onnx"],
                 ["scenario", "add", "model.onnx", "half", "--passes", "cast-fp16,cleanup"],
                 ["scenario", "add", "model.onnx", "int4", "--passes",
                  '[{"name": "quantize-weights", "bits": 4, "block_size": 32}]'],
                 ["scenario", "list", "model.onnx"], ["scenario", "list", "model.onnx", "--json"],
                 ["scenario", "show", "model.onnx", "half"],
                 ["scenario", "show", "model.onnx", "int4", "--json"],
                 ["scenario", "remove", "model.onnx", "int4"],
                 ["convert", "to-external", "model.onnx", "external.onnx", "--threshold", "0"],
                 ["inspect", "external.onnx"],
                 ["scenario", "list", "external.onnx"],
                 ["convert", "to-inline", "external.onnx", "inline.onnx"]):
        assert _succeeds(argv, folder, ONNX_INITIALISER)[1] == [], argv
    code = ("weightstore.inspect('ge/ge.onnx')\n"
            "weightstore.add_scenario('inline.onnx', 'again', ['cast-fp16'])\n"
            "out.write(str([s['name'] for s in weightstore.list_scenarios('inline.onnx')]))\n"
            "weightstore.show_scenario('inline.onnx', 'again')\n"
            "weightstore.remove_scenario('inline.onnx', 'again')\n"
            "weightstore.convert_to_external('inline.onnx', 'api.onnx', threshold=0)\n"
            "weightstore.convert_to_inline('api.onnx', 'api-inline.onnx')\n")
    printed, loaded = _fresh(code, folder, ONNX_INITIALISER)
    assert loaded == []
    assert printed == "['half', 'again']"
    assert (onnx.load(str(folder / "api-inline.onnx")).graph ==
            onnx.load(str(folder / "inline.onnx")).graph)


REGISTRY_ALLOWED: set[str] = set()  # neither onnx, numpy, protobuf nor requests/urllib3


@needs_registry
def test_push_and_pull_import_neither_onnx_nor_numpy(folder: Path) -> None:
    """A registry command moves files and checks digests: onnx's initialiser (its C++
    extension, numpy, ml_dtypes) took most of a pull's start-up though nothing in a whole
    pull or a push reads a model. Only --device and --scenario, which resolve a graph,
    load onnx's messages (and never its initialiser)."""
    from weightstore.builder.run import build

    (folder / "recipe.yaml").write_text(TWO_LAYOUTS)  # combined and separate
    packages = {p.layout: p.path for p in build(folder / "recipe.yaml").packages}
    store = os.environ["WEIGHTSTORE_DIR"]
    with running_registry(folder / "registry") as server:
        for layout, package in packages.items():
            ref = f"{server.host}/startup/pkg:{layout}"
            assert _imported(["push", str(package), ref, "--store", store],
                             folder) <= REGISTRY_ALLOWED
            for into in ("new-store", store):  # every blob fetched; every one in the store
                out = folder / f"pulled-{layout}-{Path(into).name}"
                assert _imported(["pull", ref, str(out), "--store", str(folder / into)],
                                 folder) <= REGISTRY_ALLOWED
                assert (out / "summary.json").read_bytes() == \
                    (package / "summary.json").read_bytes()


@needs_registry
def test_a_device_or_scenario_pull_does_not_run_onnx_initialiser(folder: Path,
                                                                 devices: Path) -> None:
    """``pull --device`` and ``--scenario`` resolve the variant's graph and write its
    folder: onnx's messages and extension, never its initialiser."""
    store = os.environ["WEIGHTSTORE_DIR"]
    with running_registry(folder / "registry") as server:
        ref = f"{server.host}/startup/devices:1"
        _succeeds(["push", str(devices), ref, "--store", store], folder, ())  # it asserts
        for option, name in (("--device", "npu"), ("--device", "cpu-int4"),
                             ("--scenario", "half")):
            out = folder / f"pulled-{name}"
            assert _succeeds(["pull", ref, str(out), option, name, "--store",
                              str(folder / f"store-{name}")], folder, ONNX_INITIALISER)[1] == []
            assert (out / "encoder.onnx").is_file()


@needs_registry
def test_a_pull_locks_through_filelock(folder: Path) -> None:
    """Locks are the locking library's (filelock), not flock written by hand: a pull
    takes its package folder's lock and the store's through it."""
    from weightstore.builder.run import build

    (folder / "recipe.yaml").write_text(TWO_LAYOUTS)
    package = build(folder / "recipe.yaml").packages[0].path
    with running_registry(folder / "registry") as server:
        ref = f"{server.host}/startup/pkg:1"
        assert _imported(["push", str(package), ref], folder, ()) == set()
        assert _imported(["pull", ref, str(folder / "pulled"), "--store",
                          str(folder / "new")], folder, ("filelock",)) == {"filelock"}
        assert (folder / "pulled" / "summary.json").is_file()


UNUSED = (*HEAVY, "subprocess")  # what neither a push nor a pull needs


@needs_registry
def test_a_pull_from_a_plain_loopback_registry_loads_no_trust_store(folder: Path) -> None:
    """A registry command speaks HTTP through the standard library (``requests`` and
    ``urllib3`` took about 60 ms of a pull's start-up), and finding that a loopback
    registry speaks plain HTTP loads no trust store (tens of milliseconds): only a TLS
    connection that verifies a certificate needs one. ``subprocess`` loads only to run a credential
    helper. What filelock's own import loads is not weightstore's (filelock 4.1, the one
    Python 3.10 gets, imports asyncio and with it subprocess)."""
    from weightstore.builder.run import build

    (folder / "recipe.yaml").write_text(TWO_LAYOUTS)
    package = build(folder / "recipe.yaml").packages[0].path
    store = os.environ["WEIGHTSTORE_DIR"]
    code = ("import json, ssl, sys\n"
            "import filelock\n"
            f"theirs = {{m for m in {UNUSED!r} if m in sys.modules}}\n"
            "from weightstore.cli import main\n"
            "made = []\n"
            "real = ssl.create_default_context\n"
            "ssl.create_default_context = lambda *a, **k: made.append(1) or real(*a, **k)\n"
            "argv = json.loads(sys.argv[1])\n"
            "assert main(argv) == 0\n"
            f"print(json.dumps([len(made), sorted(m for m in {UNUSED!r} "
            "if m in sys.modules and m not in theirs)]))\n")
    with running_registry(folder / "registry") as server:
        ref = f"{server.host}/startup/pkg:1"
        for argv in (["push", str(package), ref, "--store", store],
                     ["pull", ref, str(folder / "pulled"), "--store", str(folder / "new")]):
            done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], cwd=folder,
                                  capture_output=True, text=True, env=os.environ.copy())
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, []], argv


@needs_registry
def test_a_registries_conf_of_comments_only_loads_no_toml_parser(folder: Path,
                                                                  monkeypatch) -> None:
    """Distributions ship ``/etc/containers/registries.conf`` as comments only (skopeo's
    and podman's packages do): a pull that reads it loads no TOML parser for it. What
    TOML refuses (a control character in a comment, a lone carriage return, a form
    feed) still goes to the parser, and is refused."""
    from weightstore.builder.run import build
    from weightstore.cli import main
    from weightstore.errors import RegistryError
    from weightstore.registry.mirrors import read_mirrors

    conf = folder / "registries.conf"
    conf.write_text("# For more information on this configuration file, see\n"
                    "# containers-registries.conf(5).\n#\n"
                    "# unqualified-search-registries = [\"example.com\"]\n\n"
                    "\t# [[registry]]\r\n#\tlocation = \"example.com\"\n")
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    (folder / "recipe.yaml").write_text(TWO_LAYOUTS)
    package = build(folder / "recipe.yaml").packages[0].path
    with running_registry(folder / "registry") as server:
        ref = f"{server.host}/startup/conf:1"
        assert main(["push", str(package), ref, "--store", os.environ["WEIGHTSTORE_DIR"]]) == 0
        assert _imported(["pull", ref, str(folder / "pulled"), "--store",
                          str(folder / "new")], folder, ("tomllib", "tomli")) == set()
    assert (folder / "pulled" / "summary.json").is_file()
    assert read_mirrors(conf) == []
    for refused in (b"# a comment\x7f TOML refuses\n", b"# a lone\r# carriage return\n",
                    b"\x0c\n"):
        conf.write_bytes(refused)
        with pytest.raises(RegistryError, match=r"registries\.conf does not parse"):
            read_mirrors(conf)


@needs_registry
def test_a_pull_of_a_foreign_artifact_imports_neither_onnx_nor_numpy(folder: Path) -> None:
    """The generic pull of what another client pushed (a file layer and a folder as a
    tar+gzip layer, by oras-py) moves and unpacks files: no model is read."""
    import oras.client

    (folder / "weights").mkdir()
    (folder / "weights" / "w.bin").write_bytes(b"\x01" * 64)
    with running_registry(folder / "registry") as server:
        ref = f"{server.host}/startup/foreign:1"
        cwd = os.getcwd()
        os.chdir(folder)  # oras-py takes paths relative to the working folder
        try:
            oras.client.OrasClient(insecure=True).push(target=ref,
                                                       files=["model.onnx", "weights"])
        finally:
            os.chdir(cwd)
        out = folder / "pulled"
        assert _imported(["pull", ref, str(out), "--store", str(folder / "store")],
                         folder) <= REGISTRY_ALLOWED
    assert (out / "model.onnx").read_bytes() == (folder / "model.onnx").read_bytes()
    assert (out / "weights" / "w.bin").read_bytes() == b"\x01" * 64


OTHER_COMMANDS = ("weightstore.release.commands", "weightstore.resolve.commands",
                  "weightstore.registry.commands", "weightstore.store.commands",
                  "weightstore.report.commands")


def test_a_command_builds_only_its_own_parsers(folder: Path) -> None:
    """The parsers (and modules) of other commands are neither imported nor built; help and
    unknown commands still see every command."""
    from weightstore import cli

    def commands(parser: argparse.ArgumentParser) -> list[str]:
        return [name for action in parser._actions
                if isinstance(action, argparse._SubParsersAction) for name in action.choices]

    assert commands(cli._parser("build")) == ["build"]
    assert commands(cli._parser("unpack")) == ["verify", "release", "unpack", "diff"]
    every = commands(cli._parser())
    assert every == commands(cli._parser("no-such-command"))
    assert sorted(every) == sorted(cli.COMMANDS)
    assert _imported(["inspect", "model.onnx"], folder, OTHER_COMMANDS) == set()
    assert _imported(["store", "stats", "--store", "nowhere"], folder,
                     OTHER_COMMANDS) == {"weightstore.store.commands"}
    assert _imported(["--help"], folder, OTHER_COMMANDS) == set(OTHER_COMMANDS)


@pytest.mark.parametrize("argv", [["-h", "build"], ["--help", "build"], ["--hel", "build"],
                                  ["-qh", "build"]])
def test_help_before_a_command_lists_every_command(argv, capsys):
    from weightstore import cli

    with pytest.raises(SystemExit):
        cli.main(argv)
    listed = capsys.readouterr().out
    assert all(f"    {name}" in listed for name in cli.COMMANDS)


def test_a_double_dash_before_the_command_is_judged_against_every_command(capsys):
    from weightstore import cli

    assert cli.main(["--", "build"]) == 2
    assert "'schema'" in capsys.readouterr().err



@pytest.mark.parametrize("argv", [["--version"], ["store", "stats", "--store", "nowhere"],
                                  ["no-such-command"]])
def test_the_process_freezes_the_collector_before_it_shuts_down(argv: list[str],
                                                                tmp_path: Path) -> None:
    """``python -m weightstore`` and the console script (both ``cli.run``) end with the
    collector's objects frozen, so the interpreter's last collections do not walk them;
    ``main()`` leaves the collector as it was. The exit code is the command's either way."""
    probe = ("import atexit, gc, runpy, sys\n"
             "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
             "sys.argv = ['weightstore', *{argv!r}]\n"
             "{call}\n")
    calls = {"process": "runpy.run_module('weightstore', run_name='__main__')",
             "main": "from weightstore.cli import main\nsys.exit(main())"}
    done = {name: subprocess.run([sys.executable, "-c", probe.format(argv=argv, call=call)],
                                 cwd=tmp_path, capture_output=True, text=True,
                                 env=os.environ.copy())
            for name, call in calls.items()}
    assert done["process"].stdout.splitlines()[-1] == "frozen True"
    assert done["main"].stdout.splitlines()[-1] == "frozen False"
    assert done["process"].returncode == done["main"].returncode
    # a store that is not there, and a command that is not one, are exit code 2
    assert done["process"].returncode == (0 if argv == ["--version"] else 2)
    scripts = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert 'weightstore = "weightstore.cli:run"' in scripts
