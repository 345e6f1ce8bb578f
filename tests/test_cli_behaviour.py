"""The command line behaves like its peers: quiet pipes, plain help, JSON errors, -q/-v."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from weightstore.cli import main

from .helpers import package_objects
from .test_build import write_recipe


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weightstore", *args], capture_output=True,
                          text=True, check=False, timeout=120)


def test_jobs_not_an_integer(tmp_path):
    res = _run("build", str(tmp_path / "r.yaml"), "--jobs", "x")
    assert res.returncode == 2
    assert "--jobs: not an integer" in res.stderr
    assert "Traceback" not in res.stderr


def test_usage_errors_take_the_one_line_form(tmp_path, capsys):
    """A command line argparse refuses gets the form every other error has: one line,
    exit 2, and a JSON object when ``--json`` was asked for."""
    recipe = str(tmp_path / "r.yaml")
    assert main(["build", recipe, "--jobs", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("weightstore: error: ")
    assert "--jobs: not an integer" in err and "weightstore build --help" in err
    assert main(["build", recipe, "--jobs", "x", "--json"]) == 2
    doc = json.loads(capsys.readouterr().err)
    assert doc == {"error": "argument --jobs: not an integer",
                   "context": {"usage": "weightstore build --help"}}
    assert main(["store", "rm", "nope", "--json"]) == 2  # store rm has no --json
    doc = json.loads(capsys.readouterr().err)
    assert doc["error"] == "unrecognized arguments: --json"
    assert main(["nosuchcommand"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


REST_MARKUP = re.compile(r"``|:(?:func|class|mod|meth|attr|data|exc|ref|doc):`|^\.\. \w+::",
                         re.MULTILINE)


def test_help_is_plain_text():
    for args in ([], ["convert"], ["convert", "to-inline"], ["build"], ["store", "verify"]):
        res = _run(*args, "--help")
        assert res.returncode == 0
        assert not REST_MARKUP.search(res.stdout), res.stdout


def test_every_commands_help_is_plain_text():
    """All parsers, at every depth (the help of each command is built from docstrings)."""
    from weightstore.cli import _parser, _subparsers

    top = _parser()
    parsers = [top, *_subparsers(top)]
    assert len(parsers) > 30
    for parser in parsers:
        text = parser.format_help()
        assert not REST_MARKUP.search(text), f"{parser.prog}:\n{text}"


def test_convert_subcommands_show_only_their_options():
    inline = _run("convert", "to-inline", "--help").stdout
    external = _run("convert", "to-external", "--help").stdout
    assert "--value-bins" in inline and "--threshold" not in inline
    assert "--threshold" in external and "--value-bins" not in external


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    inits = [numpy_helper.from_array(np.full(4, i, np.float32), f"tensor_{i}")
             for i in range(3000)]
    nodes = [helper.make_node("Identity", [t.name], [f"y{i}"]) for i, t in enumerate(inits)]
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4])
            for i in range(len(inits))]
    model = helper.make_model_gen_version(helper.make_graph(nodes, "g", [], outs, inits),
                                          opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "many.onnx"
    onnx.save(model, str(path))
    proc = subprocess.Popen([sys.executable, "-m", "weightstore", "inspect", str(path),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # like `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert err == ""


def test_json_errors_are_json(tmp_path, capsys):
    missing = tmp_path / "missing.onnx"
    assert main(["inspect", str(missing), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    doc = json.loads(captured.err)
    assert doc == {"error": "model file not found", "context": {"file": str(missing)}}


def test_quiet_and_verbose(encoder_model, save_model, tmp_path, capsys):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    assert main(["-q", "build", str(recipe), "--store", str(tmp_path / "s")]) == 0
    assert capsys.readouterr() == ("", "")
    assert main(["-v", "inspect", str(tmp_path / "nope.onnx")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith(
        f"weightstore: error: model file not found (file={tmp_path / 'nope.onnx'})")


def test_schema_goes_to_stdout(capsys, tmp_path):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] and "properties" in schema
    assert list(tmp_path.iterdir()) == []


def test_schema_output_errors_name_the_path_given(capsys, tmp_path):
    """Not the temp file beside it, and not a bare "File exists"."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "folder").mkdir()
    assert main(["schema", "--output", str(tmp_path / "afile" / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "not a folder" in err and f"blocked_by={tmp_path / 'afile'}" in err
    assert main(["schema", "--output", str(tmp_path / "folder")]) == 2
    err = capsys.readouterr().err
    assert err == ("weightstore: error: output path is not a regular file but a folder; "
                   "only a regular file or a new path is written "
                   f"(output={tmp_path / 'folder'})\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "folder"]


def test_store_commands_find_the_recipes_store(encoder_model, save_model, tmp_path, capsys):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n",
                          extra="")
    text = recipe.read_text().replace("store: {hash: blake3}",
                                      "store: {hash: blake3, path: my-store}")
    recipe.write_text(text)
    assert main(["build", str(recipe)]) == 0
    assert (tmp_path / "my-store").is_dir()
    capsys.readouterr()
    assert main(["store", "stats", "--recipe", str(recipe), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] > 0
    assert main(["store", "verify", "--recipe", str(recipe)]) == 0
    assert Path(tmp_path / "my-store").is_dir()


def test_refusing_a_different_build_names_what_changed(encoder_model, shared_pair,
                                                        save_model, tmp_path):
    import pytest

    from weightstore.builder.run import BuildOptions, build
    from weightstore.errors import PackageError

    src = save_model(encoder_model, "m.onnx")
    recipe = write_recipe(tmp_path, {"m": src}, "\n  - {name: c, external_weight: combined}\n")
    build(recipe, BuildOptions(store=str(tmp_path / "s")))
    recipe.write_text(recipe.read_text().replace("external_weight: combined}",
                                                 "external_weight: combined, "
                                                 "size_threshold: 4096}"))
    with pytest.raises(PackageError, match="different build") as err:
        build(recipe, BuildOptions(store=str(tmp_path / "s")))
    assert err.value.context["changed"] == "layout size_threshold"
    onnx.save(shared_pair[1], str(src))
    with pytest.raises(PackageError) as err:
        build(recipe, BuildOptions(store=str(tmp_path / "s")))
    assert err.value.context["changed"] == "source of model 'm', layout size_threshold"


def test_dry_run_prints_the_plan_and_writes_nothing(encoder_model, save_model, tmp_path,
                                                     capsys):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}"
                          "\n  - {name: e, external_weight: embedded}\n")
    store = tmp_path / "s"
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["build", str(recipe), "--store", str(store), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no store, no output
    assert "build c:" in out and "build e:" in out
    assert "would write" in out and "reuse 0 (0.0 MB)" in out
    assert main(["build", str(recipe), "--store", str(store), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    # payload bytes: the rest are the package's model and summary, kept for its record
    stored = built["store_report"]["written_bytes"] - sum(
        package_objects(tmp_path / "out/pkg/1.0.0/c").values())
    (tmp_path / "out/pkg/1.0.0/c/summary.json").unlink()  # c must be rebuilt, e is up to date
    import shutil

    shutil.rmtree(tmp_path / "out/pkg/1.0.0/c")
    assert main(["build", str(recipe), "--store", str(store), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # the store has c's action record and every payload: the build would materialize it
    assert [p["status"] for p in plan["packages"]] == ["would-materialize", "up-to-date"]
    assert plan["store_report"]["written_bytes"] == 0
    assert plan["store_report"]["reused_bytes"] == stored
    assert not (tmp_path / "out/pkg/1.0.0/c").exists()
    assert main(["build", str(recipe), "--store", str(store), "--dry-run"]) == 0
    assert "materialize c:" in capsys.readouterr().out
    for record in (store / "build-actions").iterdir():  # without its record: a conversion
        record.unlink()
    assert main(["build", str(recipe), "--store", str(store), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # and e, which the store can no longer prove to be the build, would be rebuilt
    assert [p["status"] for p in plan["packages"]] == ["would-build", "would-build"]
    assert not (tmp_path / "out/pkg/1.0.0/c").exists()
    assert main(["build", str(recipe), "--store", str(store), "--json"]) == 0  # a record
    shutil.rmtree(tmp_path / "out/pkg/1.0.0/c")
    capsys.readouterr()
    assert main(["build", str(recipe), "--store", str(store), "--dry-run", "--force",
                 "--json"]) == 0  # --force converts: never 'materialize'
    plan = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in plan["packages"]] == ["would-build", "would-build"]


def test_progress_shows_rate_and_eta_on_a_terminal_only():
    import io

    from weightstore.progress import Progress

    shown = io.StringIO()
    with Progress("hashing", 50_000_000, enabled=True, stream=shown) as bar:
        for _ in range(5):
            bar.advance(10_000_000)
    text = shown.getvalue()
    assert "hashing" in text and "B/s" in text and "100%" in text
    assert "<" in text  # elapsed<remaining: the ETA
    hidden = io.StringIO()  # not a terminal, nothing said: silence
    with Progress("hashing", 10, stream=hidden) as bar:
        bar.advance(10)
    assert hidden.getvalue() == ""


def _damaged_build(encoder_model, save_model, tmp_path) -> tuple[Path, Path]:
    """A package and a store, each with one weight byte flipped."""
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    store = tmp_path / "s"
    assert main(["-q", "build", str(recipe), "--store", str(store)]) == 0
    package = tmp_path / "out/pkg/1.0.0/c"
    for victim in (next(package.glob("*_weight_combined")), next(store.glob("*_weight_combined"))):
        data = bytearray(victim.read_bytes())
        data[0] ^= 0xFF
        victim.write_bytes(bytes(data))
    return package, store


def test_quiet_still_reports_failures(encoder_model, save_model, tmp_path, capsys):
    """-q hides the report, never the reasons a command failed: they go to stderr."""
    package, store = _damaged_build(encoder_model, save_model, tmp_path)
    capsys.readouterr()
    for argv in (["-q", "verify", str(package)], ["-q", "check", str(package), "--verify"],
                 ["-q", "store", "verify", "--store", str(store)],
                 ["store", "verify", "--store", str(store), "-q"]):
        assert main(argv) == 1, argv
        out, err = capsys.readouterr()
        assert out == "", argv
        assert err.startswith("problem: ") and "weight_combined" in err, argv
    assert main(["verify", str(package)]) == 1  # without -q: all of it on stdout
    out, err = capsys.readouterr()
    assert "problem: " in out and err == ""


def test_global_options_after_the_command(encoder_model, save_model, tmp_path, capsys):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    assert main(["build", str(recipe), "--store", str(tmp_path / "s"), "-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert main(["inspect", str(tmp_path / "nope.onnx"), "--verbose"]) == 2
    assert "Traceback" in capsys.readouterr().err
    for argv in (["build", str(recipe), "-q", "-v"], ["-q", "build", str(recipe), "-v"],
                 ["-v", "store", "stats", "--quiet"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "not allowed with argument -q/--quiet" in err and err.count("\n") == 1, argv


def test_unrecognized_arguments_point_at_the_commands_help(tmp_path, capsys):
    for argv, usage in ((["build", "r.yaml", "--bogus"], "weightstore build --help"),
                        (["store", "verify", "--bogus"], "weightstore store verify --help"),
                        (["convert", "to-inline", "a", "b", "c"],
                         "weightstore convert to-inline --help")):
        assert main([*argv, "--json"]) == 2
        doc = json.loads(capsys.readouterr().err)
        assert doc["error"].startswith("unrecognized arguments: ") and "--json" not in doc[
            "error"], argv
        assert doc["context"] == {"usage": usage}, argv
    assert main(["build", "r.yaml", "--bogus"]) == 2
    assert capsys.readouterr().err == ("weightstore: error: unrecognized arguments: --bogus "
                                       "(usage=weightstore build --help)\n")


def test_every_integer_option_says_not_an_integer(tmp_path, capsys):
    p = str(tmp_path / "p")
    for argv, option in ((["push", p, "localhost/r:1", "--jobs", "x"], "--jobs"),
                         (["pull", "localhost/r:1", "--jobs", "x"], "--jobs"),
                         (["push", p, "localhost/r:1", "--chunk-size", "x"], "--chunk-size"),
                         (["build", p, "--jobs", "x"], "--jobs"),
                         (["verify", p, "--jobs", "x"], "--jobs"),
                         (["release", p, "--jobs", "x"], "--jobs"),
                         (["release", p, "--level", "x"], "--level"),
                         (["store", "verify", "--jobs", "x"], "--jobs"),
                         (["convert", "to-external", p, p, "--threshold", "x"], "--threshold"),
                         (["convert", "to-external", p, p, "--alignment", "x"], "--alignment")):
        assert main(argv) == 2, argv
        assert f"argument {option}: not an integer" in capsys.readouterr().err, argv
    assert main(["pull", "localhost/r:1", "--jobs", "0"]) == 2
    assert "argument --jobs: must be at least 1" in capsys.readouterr().err
    huge = "99999999999999999999"  # once an OverflowError's traceback from the thread pool
    for argv, option, top in ((["release", p, "--jobs", huge], "--jobs", 256),
                              (["verify", p, "--jobs", huge], "--jobs", 256),
                              (["build", p, "--jobs", huge], "--jobs", 256),
                              (["store", "verify", "--jobs", "257"], "--jobs", 256),
                              (["assemble", p, "--jobs", huge], "--jobs", 256),
                              (["pull", "localhost/r:1", "--jobs", huge], "--jobs", 256),
                              (["push", p, "localhost/r:1", "--chunk-size", huge],
                               "--chunk-size", 1 << 30)):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err.startswith(
            f"weightstore: error: argument {option}: must be at least 1 and at most {top} ("
        ), argv
    bounds = "must be more than 0 and at most 86400"
    for value, reason in (("x", "not a number"), ("0", bounds), ("inf", bounds),
                          ("nan", bounds), ("1e300", bounds)):
        assert main(["pull", "localhost/r:1", "--timeout", value]) == 2
        assert f"argument --timeout: {reason}" in capsys.readouterr().err


def test_gc_options_are_named_as_flags(tmp_path, capsys):
    store = tmp_path / "s"
    store.mkdir()
    for ratio in ("7", "0", "-1", "x"):
        assert main(["store", "gc", "--store", str(store), "--compact-ratio", ratio]) == 2
        err = capsys.readouterr().err
        assert err.startswith("weightstore: error: argument --compact-ratio: "), ratio
        assert "compact_ratio" not in err and "older_than" not in err


def test_gc_dry_run_lists_stale_temp_files(encoder_model, save_model, tmp_path, capsys):
    import os
    import time

    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    store = tmp_path / "s"
    assert main(["-q", "build", str(recipe), "--store", str(store)]) == 0
    temp = store / ".weight_dead.abc.tmp"
    temp.write_bytes(b"partial")
    old = time.time() - 86400
    os.utime(temp, (old, old))
    assert main(["store", "gc", "--store", str(store), "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["temps"] == [temp.name]
    assert main(["store", "gc", "--store", str(store), "--dry-run"]) == 0
    assert f"remove stale temp file {temp.name}" in capsys.readouterr().out
    assert temp.exists()
    assert main(["store", "gc", "--store", str(store)]) == 0
    assert f"removed stale temp file {temp.name}" in capsys.readouterr().out
    assert not temp.exists()


def test_run_refuses_inputs_that_are_not_an_npz(tmp_path, capsys):
    junk = tmp_path / "junk.txt"
    junk.write_text("not arrays\n")
    np.save(tmp_path / "one.npy", np.zeros(3, np.float32))
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([object()], dtype=object))
    compressed = tmp_path / "compressed.npz"  # a member's deflate stream damaged
    np.savez_compressed(compressed, x=np.arange(4096, dtype=np.float32))
    data = bytearray(compressed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    compressed.write_bytes(bytes(data))
    zip_head = tmp_path / "zip_head.npz"  # a zip's magic, then nothing a zip holds
    zip_head.write_bytes(b"PK\x03\x04garbage")
    encrypted = tmp_path / "encrypted.npz"  # a member flagged encrypted (zipfile: RuntimeError)
    np.savez(encrypted, x=np.arange(4, dtype=np.float32))
    data = bytearray(encrypted.read_bytes())
    for header, flags in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local, central
        at = data.find(header)
        data[at + flags] |= 0x01
    encrypted.write_bytes(bytes(data))
    for path, extra in ((junk, ""), (tmp_path / "one.npy", ""), (objects, ", member=x"),
                        (compressed, ", member=x"), (zip_head, ""),
                        (encrypted, ", member=x")):
        assert main(["run", str(tmp_path / "nope"), "--inputs", str(path)]) == 2
        err = capsys.readouterr().err
        assert err == ("weightstore: error: cannot read the inputs: they must be a .npz "
                       "file of arrays (numpy.savez), one per model input "
                       f"(file={path}{extra})\n")


def test_run_refuses_an_inputs_fifo_without_waiting_on_it(tmp_path):
    fifo = tmp_path / "inputs.npz"
    os.mkfifo(fifo)
    res = _run("run", str(tmp_path / "nope"), "--inputs", str(fifo))  # no writer: never opened
    assert res.returncode == 2
    assert res.stderr == ("weightstore: error: cannot read the inputs: not a regular file (a "
                          f"FIFO, device or socket is never read) (file={fifo})\n")


def test_release_checks_its_output_before_building(encoder_model, save_model, tmp_path,
                                                   capsys):
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")},
                          "\n  - {name: c, external_weight: combined}\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    for output in (afile, afile / "x"):
        assert main(["release", str(recipe), "--store", str(tmp_path / "s"),
                     "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert "not a folder" in err and f"blocked_by={afile}" in err
        assert not (tmp_path / "s").exists() and not (tmp_path / "out").exists()


def test_refusing_a_different_build_names_every_input(encoder_model, save_model, tmp_path):
    """Every input of the fingerprint that the folder's summary records is named when it
    changes; what it does not record is named as what it may be, never the catch-all."""
    import pytest

    from weightstore.builder.run import BuildOptions, build
    from weightstore.errors import PackageError

    src = save_model(encoder_model, "m.onnx")
    store = str(tmp_path / "s")
    devices = ("devices:\n  - {name: cpu, capabilities: {fp16: false}, scenario: null}\n"
               "  - {name: npu, capabilities: {fp16: true}, scenario: null}\n")
    recipe = write_recipe(tmp_path, {"m": src}, "\n  - {name: c, external_weight: combined}\n",
                          extra=devices)
    first = recipe.read_text()
    build(recipe, BuildOptions(store=store))

    def changed(text: str) -> str:
        recipe.write_text(text)
        with pytest.raises(PackageError, match="different build") as err:
            build(recipe, BuildOptions(store=store))
        return err.value.context["changed"]

    assert changed(first.replace("hash: blake3", "hash: sha256")) == "store.hash (blake3 -> sha256)"
    assert changed(first.replace("  - {name: npu, capabilities: {fp16: true}, scenario: null}\n",
                                 "")) == "device 'npu' removed"
    assert changed(first.replace("{fp16: true}", "{fp16: false}")) == (
        "capabilities of device 'cpu' or capabilities of device 'npu'")
    assert changed(first.replace("  - {name: cpu, capabilities: {fp16: false}, scenario: null}\n",
                                 "") + "  - {name: cpu, capabilities: {fp16: false}, "
                                       "scenario: null}\n") == "order of the devices"
    scenario = first.replace("source: " + str(src) + "}",
                             "source: " + str(src) + ", scenarios: [{name: fused, passes: "
                             "[cleanup]}]}")
    assert "scenarios:" in scenario
    assert changed(scenario) == "scenarios of model 'm'"
    build(recipe, BuildOptions(store=store, force=True))
    assert changed(scenario.replace("[cleanup]", "[fuse-qkv, cleanup]")) == (
        "scenarios of model 'm' or capabilities of device 'cpu' or capabilities of "
        "device 'npu'")
    build(recipe, BuildOptions(store=store, force=True))
    assert changed(first) == ("scenarios of model 'm' or capabilities of device 'cpu' or "
                              "capabilities of device 'npu'")  # the scenario dropped


def test_an_up_to_date_build_reports_every_store_count_as_zero(encoder_model, save_model,
                                                               tmp_path, capsys,
                                                               isolated_env):
    """``build --json`` has the same fields whatever the build did: an up-to-date build,
    decided by the build stamp or by the package summaries, reports zero counts."""
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")})
    store = str(tmp_path / "s")
    assert main(["build", str(recipe), "--store", store, "--json"]) == 0
    built = json.loads(capsys.readouterr().out)["store_report"]
    zeros = dict.fromkeys(built, 0)
    assert set(zeros) == {"written_objects", "written_bytes", "reused_objects",
                          "reused_bytes", "padding_bytes"}
    assert main(["build", str(recipe), "--store", store, "--json"]) == 0  # the stamp
    assert json.loads(capsys.readouterr().out)["store_report"] == zeros
    stamps = list((isolated_env / "cache").rglob("build-stamps/*.json"))
    assert stamps
    for stamp in stamps:
        stamp.unlink()
    assert main(["build", str(recipe), "--store", store, "--json"]) == 0  # the summaries
    assert json.loads(capsys.readouterr().out)["store_report"] == zeros
    assert main(["build", str(recipe), "--store", store]) == 0
    assert "wrote" not in capsys.readouterr().out  # the text form names no store work


def test_store_and_recipe_are_one_or_the_other(tmp_path, capsys):
    """``--store DIR | --recipe R``: both at once is a usage error, not a silent choice."""
    for command in (["store", "stats"], ["store", "verify"], ["store", "ls"],
                    ["store", "gc"], ["resolve", str(tmp_path)], ["run", str(tmp_path)]):
        assert main([*command, "--store", str(tmp_path / "s"),
                     "--recipe", str(tmp_path / "r.yaml")]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not allowed with argument --store" in err, err


def test_settings_and_paths_are_judged_before_any_work(encoder_model, save_model, tmp_path,
                                                       capsys, monkeypatch):
    """A bad --alignment is refused before the model is read; a file given where a
    package folder belongs (verify) is named as such; an unknown scenario lists the known
    ones."""
    import weightstore.convert.api as convert_api

    src = save_model(encoder_model, "m.onnx")
    opened = []
    real_open = convert_api.ModelWeights.open
    monkeypatch.setattr(convert_api.ModelWeights, "open",
                        lambda *a, **k: opened.append(a) or real_open(*a, **k))
    assert main(["convert", "to-external", str(src), str(tmp_path / "x.onnx"),
                 "--alignment", "300"]) == 2
    err = capsys.readouterr().err
    assert "alignment must be a power of two" in err and "alignment=300" in err
    assert opened == [] and not (tmp_path / "x.onnx").exists()
    assert main(["verify", str(src)]) == 2
    err = capsys.readouterr().err
    assert "not a package folder: a file" in err and f"path={src}" in err, err
    assert main(["check", str(src)]) == 0  # a model file is checked as it resolves
    assert capsys.readouterr().out.strip().endswith("ok")
    recipe = write_recipe(tmp_path, {"m": src})
    assert main(["build", str(recipe), "--store", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    package = next((tmp_path / "out").rglob("summary.json")).parent
    assert main(["check", str(package), "--scenario", "nosuch"]) == 2
    assert "known=none" in capsys.readouterr().err


def test_a_dry_run_writes_nothing_in_the_user_cache_either(encoder_model, save_model,
                                                           tmp_path, capsys, isolated_env):
    """Not even the cache key: checking an entry never creates it, only signing one does."""
    recipe = write_recipe(tmp_path, {"m": save_model(encoder_model, "m.onnx")})
    cache = isolated_env / "cache"
    assert main(["build", str(recipe), "--store", str(tmp_path / "s"), "--dry-run"]) == 0
    assert not cache.exists() or list(cache.rglob("*")) == []
    assert main(["build", str(recipe), "--store", str(tmp_path / "s")]) == 0
    assert (cache / "weightstore" / "cache-key").is_file()  # a real build signs entries


def test_error_lines_escape_what_they_quote(tmp_path):
    """A value that is not UTF-8, holds a newline or a terminal escape, and a runtime's
    message of several lines: each error is one line, nothing in it reaches the terminal
    as a control character."""
    hostile = os.fsencode(tmp_path) + b"/a\xff\x1b[31mb\nc"
    res = subprocess.run([sys.executable, "-m", "weightstore", b"inspect", hostile],
                         capture_output=True, check=False, timeout=120)
    assert res.returncode == 2
    assert res.stderr == (b"weightstore: error: model file not found (file="
                          + os.fsencode(tmp_path) + b"/a\\xff\\x1b[31mb\\nc)\n")
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.zeros(3, np.float32))  # onnxruntime: [2] expected
    res = _run("run", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.npz"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.endswith("\n")
    assert res.stderr.startswith("weightstore: error: the model did not run on these inputs: ")
    assert "\\n index: 0 Got: 3 Expected: 2\\n" in res.stderr
