"""A store shared between users, and a store under faults: another user tampering with it,
a full disk during gc's compaction and repair, and ``kill -9`` during compaction while other
processes read.

Every test uses real processes and real files. The tampering user is another uid where the
tests run as root (the store is then made group- and world-writable, as a shared store is);
elsewhere it is another process of the same user, which can do no less.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from weightstore.build.run import BuildOptions, build
from weightstore.cli import main
from weightstore.package.check import check_package
from weightstore.store import WeightStore
from weightstore.store.index import INDEX_NAME

from .helpers import assert_ge_reads_keys
from .samples import make_encoder, run_onnxruntime, sample_inputs
from .test_build import write_recipe

COMBINED = "\n  - {name: c, external_weight: combined, size_threshold: 256}\n"
REF = "pkg/1.0.0/c"
OTHER_UID = 54321


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A folder every user may enter (pytest's own are private to their owner), removed
    afterwards; with umask 0 meanwhile, as users sharing a store set it."""
    folder = Path(tempfile.mkdtemp(prefix="ws-shared-"))
    os.chmod(folder, 0o777)
    mask = os.umask(0)
    try:
        yield folder
    finally:
        os.umask(mask)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def built(shared: Path) -> dict:
    """The first user's build: a one-layer encoder in a combined layout, its store, and
    the inputs and outputs of onnxruntime on the source."""
    model = make_encoder(seed=3, hidden=32, layers=1)
    source = shared / "m.onnx"
    onnx.save_model(model, str(source))
    recipe = write_recipe(shared, {"m": source}, COMBINED)
    store = shared / "store"
    build(recipe, BuildOptions(store=str(store), jobs=2))
    feed = sample_inputs(model)
    np.savez(shared / "in.npz", **feed)
    return {"recipe": recipe, "store": store, "package": shared / "out" / "pkg" / "1.0.0" / "c",
            "inputs": shared / "in.npz", "expected": run_onnxruntime(model, feed)}


TAMPER = r"""
import json, os, sqlite3, sys
from pathlib import Path
store, what, key, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if what == "object":  # the object's file replaced by one with a byte flipped in key's range
    con = sqlite3.connect(store / "index.sqlite")
    file, offset = con.execute("SELECT file, offset FROM objects WHERE key = ?", (key,)).fetchone()
    con.close()
    data = bytearray((store / file).read_bytes())
    data[offset + 7] ^= 0xFF
    (store / ".tampered").write_bytes(data)
    os.replace(store / ".tampered", store / file)
elif what == "row":  # key's row pointed at the range of another payload of its size
    con = sqlite3.connect(store / "index.sqlite")
    offset = con.execute("SELECT offset FROM objects WHERE key = ?", (other,)).fetchone()[0]
    con.execute("UPDATE objects SET offset = ? WHERE key = ?", (offset, key))
    con.commit()
    con.close()
elif what == "meta":  # meta.json made a format 1 index that maps key to other's range
    con = sqlite3.connect(store / "index.sqlite")
    file, offset, size = con.execute(
        "SELECT file, offset, size FROM objects WHERE key = ?", (other,)).fetchone()
    con.close()
    (store / "meta.json").write_text(json.dumps({
        "format_version": 1, "hash_to_weight_file": {key: file},
        "hash_to_weight_offset": {key: offset}, "hash_to_weight_size": {key: size}}))
"""


SYSTEM_PYTHON = "/usr/bin/python3"  # one every user may run (a venv may sit in a home)


def as_another_user(script: str, *argv: str) -> None:
    """Run a Python script (the standard library only) as the other user of the shared
    store: another uid where the tests run as root, else another process."""
    python, kwargs = sys.executable, {}
    if os.geteuid() == 0 and os.access(SYSTEM_PYTHON, os.X_OK):
        python = SYSTEM_PYTHON
        kwargs = {"user": OTHER_UID, "group": OTHER_UID, "extra_groups": []}
    subprocess.run([python, "-c", script, *argv], check=True, timeout=60,
                   cwd=Path(argv[0]).parent, **kwargs)


def same_size_pair(store: Path) -> tuple[str, str]:
    """Two payloads of one size in the combined file (a swap GE could not tell)."""
    with sqlite3.connect(store / INDEX_NAME) as conn:
        rows = conn.execute("SELECT key, size FROM objects WHERE file LIKE '%_weight_combined' "
                            "ORDER BY size DESC, key").fetchall()
    by_size: dict[int, list[str]] = {}
    for key, size in rows:
        by_size.setdefault(size, []).append(key)
    return next(keys for keys in by_size.values() if len(keys) >= 2)[:2]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("weightstore: error: "), err
    return err


def run_store(built: dict, output: Path) -> int:
    return main(["run", REF, "--store", str(built["store"]), "--inputs", str(built["inputs"]),
                 "--output", str(output)])


def assert_outputs(built: dict, output: Path) -> None:
    with np.load(output) as got:
        for name, want in zip(got.files, built["expected"], strict=True):
            np.testing.assert_array_equal(got[name], want)


@pytest.mark.parametrize("what", ["object", "row", "meta"])
def test_another_user_tampering_with_a_shared_store(built: dict, what: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """Whatever the other user changed, no read path hands out the wrong bytes: each
    fails closed with one line, or heals, and the first user's build and run stay
    bit-identical to the source."""
    store = built["store"]
    key, other = same_size_pair(store)
    as_another_user(TAMPER, str(store), what, key, other)
    capsys.readouterr()
    # store verify: damage is a problem (exit 1) naming the key; meta.json a warning
    code = main(["store", "verify", "--store", str(store)])
    out = capsys.readouterr().out
    if what == "meta":
        assert code == 0 and "stale_marker" in out
    else:
        assert code == 1 and key in out
    # export-meta: what GE would read is proved first
    ge = tmp_path / "ge.json"
    code = main(["store", "export-meta", "--store", str(store), "--output", str(ge)])
    if what == "meta":
        assert code == 0
        assert_ge_reads_keys(store, json.loads(ge.read_bytes()))
    else:
        assert code == 2 and key in one_line(capsys) and not ge.exists()
    # run --store: the right outputs, or one line naming the damage
    output = tmp_path / "run.npz"
    code = run_store(built, output)
    if code == 0:
        assert_outputs(built, output)
    else:
        assert code == 2 and "store verify --repair" in one_line(capsys)
        assert what != "meta"  # meta.json is no index: nothing reads offsets from it
    # build warm (the package folder gone): a package bit-identical to a build from the
    # source, the store healed where the build rewrote the object
    shutil.rmtree(built["package"])
    assert main(["build", str(built["recipe"]), "--store", str(store)]) == 0
    assert check_package(built["package"], verify=True).ok
    assert main(["run", str(built["package"]), "--inputs", str(built["inputs"]),
                 "--output", str(tmp_path / "pkg.npz")]) == 0
    assert_outputs(built, tmp_path / "pkg.npz")
    # and after store verify --repair, every read path agrees again
    assert main(["store", "verify", "--repair", "--store", str(store)]) == 0
    assert main(["build", str(built["recipe"]), "--store", str(store), "--force"]) == 0
    assert WeightStore(store).verify().ok
    assert main(["store", "export-meta", "--store", str(store), "--output", str(ge)]) == 0
    assert_ge_reads_keys(store, json.loads(ge.read_bytes()))
    assert run_store(built, output) == 0
    assert_outputs(built, output)
