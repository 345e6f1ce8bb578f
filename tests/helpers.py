"""Small helpers shared by the tests (the store tests most of all)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from weightstore.io.locks import lock_files_removable
from weightstore.store import StoredObject, WeightStore

if TYPE_CHECKING:
    import onnx

# the encoder in model.onnx, packaged as one combined file and as one file a weight
TWO_LAYOUTS = """\
package: pkg
version: "1.0.0"
models:
  - {name: encoder, source: model.onnx}
layouts:
  - {name: combined, external_weight: combined, size_threshold: 64, constants: external-data}
  - {name: per-weight, external_weight: separate, size_threshold: 64}
output: out
"""

# Lock files go with their holder only where filelock hands the locked descriptor to an
# on_acquired check (filelock 4); an older one keeps them, as docs/development.md says.
needs_removable_locks = pytest.mark.skipif(
    not lock_files_removable(), reason="this filelock has no on_acquired: lock files are kept")


def store_index(store: WeightStore) -> dict[str, StoredObject]:
    """The whole index as a dict (tests only: the store's API never hands it out)."""
    return {obj.key: obj for obj in store.objects()}


INFRA = frozenset({"index.sqlite", "index.sqlite-wal", "index.sqlite-shm", "meta.json",
                   "meta.json.lock", "locks"})


def store_files(root: Path) -> list[str]:
    """Names in a store root other than the index, its marker and the lock folder."""
    return sorted(name for name in os.listdir(root) if name not in INFRA)


def set_row(store: WeightStore, key: str, **fields: object) -> None:
    """Damage the index the way a bug or a hand edit would: change one row's fields."""
    with store.index.writing() as conn:
        for name, value in fields.items():
            assert name in ("file", "offset", "size")
            conn.execute(f"UPDATE objects SET {name} = ? WHERE key = ?", (value, key))


def assert_ge_reads_keys(root: Path, doc: dict) -> None:
    """GE's reader over an exported ``meta.json``: every offset and size names bytes that
    hash to their key in their file."""
    from weightstore.io.digests import digest_bytes, split_key

    for key, file in doc["hash_to_weight_file"].items():
        with open(root / file, "rb") as f:
            f.seek(doc["hash_to_weight_offset"][key])
            data = f.read(doc["hash_to_weight_size"][key])
        algo, hex_digest = split_key(key)
        assert digest_bytes(algo, data) == hex_digest, key


def package_objects(folder: Path) -> dict[str, int]:
    """The store objects a build keeps of a package's other files (model files, device
    files, ``summary.json``) for its action record: key -> size."""
    import json

    from weightstore.caches.build_actions import whole_files

    data = (folder / "summary.json").read_bytes()
    return {f.pieces[0].key: f.size for f in whole_files(json.loads(data), data)}


def index_bytes(root: Path) -> dict[str, bytes]:
    """The store index's files, byte for byte (compare before and after to prove no write)."""
    return {p.name: p.read_bytes() for p in root.iterdir() if p.name.startswith("index")}


def freeze_index(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Make the store at ``root`` behave as a read-only index (any write fails loudly),
    after folding its WAL into the main file; returns :func:`index_bytes` of it."""
    import sqlite3

    from weightstore.store.index import Index

    conn = sqlite3.connect(root / "index.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # held open for the test, as the store's other users hold it: the journal and its
    # shared-memory file stay (empty), whether or not Python has collected the
    # connections of the builds before (3.10 has, 3.11 has not); closed at teardown
    monkeypatch.setattr(sys.modules[__name__], "_HELD_INDEX", conn, raising=False)
    monkeypatch.setattr(Index, "writable", lambda self: False)
    monkeypatch.setattr(Index, "writing", None)
    return index_bytes(root)


def record_calls(monkeypatch, owner: object, attribute: str) -> list[tuple]:
    """Wrap ``owner.attribute`` for the test: each call still runs, and its positional
    arguments are appended to the returned list."""
    calls: list[tuple] = []
    real = getattr(owner, attribute)

    def recorded(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, recorded)
    return calls


SCENARIO_PACKAGE = """\
package: pk
version: "1.0.0"
store: {{path: {store}}}
models:
  - name: encoder
    source: {src}
    scenarios:
      - {{name: half, passes: [cast-fp16, cleanup]}}
      - {{name: fused, passes: [fuse-qkv, cleanup]}}
layouts:
  - {{name: combined, external_weight: combined, split: scenario}}
devices:
  - {{name: npu, scenario: half}}
  - {{name: cpu, capabilities: {{cpu: true}}, scenario: fused}}
output: {out}
"""


def scenario_package(folder: Path):
    """Build a small encoder with two scenarios and a device into ``folder`` (its store is
    ``folder/store``): returns (the package folder, the source model)."""
    import onnx

    from weightstore.builder.run import BuildOptions, build

    from .samples import make_encoder

    model = make_encoder(vocab=64, hidden=16, layers=1, seed=9)
    onnx.save_model(model, folder / "e.onnx")
    (folder / "r.yaml").write_text(SCENARIO_PACKAGE.format(
        store=folder / "store", src=folder / "e.onnx", out=folder / "dist"))
    build(folder / "r.yaml", BuildOptions())
    return folder / "dist" / "pk" / "1.0.0" / "combined", model


FILE_CONSTANT_PACKAGE = """\
package: pk
version: "1"
store: {{path: {store}}}
models:
  - {{name: encoder, source: {src}}}
layouts:
  - {{name: ge, external_weight: combined, constants: file-constant, size_threshold: 64}}
  - {{name: ge-separate, external_weight: separate, constants: file-constant,
      size_threshold: 16}}
devices:
  - {{name: npu, capabilities: {{accelerator: npu}}}}
output: {out}
"""


def file_constant_package(folder: Path, source: Path) -> Path:
    """Build ``source`` into GE's form (FileConstant nodes: a combined layout ``ge`` and a
    separate one ``ge-separate``, a device ``npu``) in ``folder`` (store ``folder/store``);
    returns the version folder holding both layouts."""
    from weightstore.builder.run import BuildOptions, build

    (folder / "ge.yaml").write_text(FILE_CONSTANT_PACKAGE.format(
        store=folder / "store", src=source, out=folder / "out"))
    build(folder / "ge.yaml", BuildOptions(jobs=2))
    return folder / "out" / "pk" / "1"


def tamper_consistently(folder: Path, model: str = "encoder.onnx") -> None:
    """Edit a package folder so that it still agrees with its own summary: +5.0 on one
    inline Constant of ``model`` (the first attention's scale), and the file's new size
    and digest written into ``summary.json``'s ``contents``; the fingerprint is left alone."""
    import onnx
    from onnx import numpy_helper

    path = folder / model
    proto = onnx.load(str(path), load_external_data=False)
    node = next(n for n in proto.graph.node
                if n.op_type == "Constant" and n.output[0].endswith("attention.scale"))
    tensor = node.attribute[0].t
    values = numpy_helper.to_array(tensor)  # + 5 in its own type (numpy 1 widens a 0-d one)
    tensor.CopyFrom(numpy_helper.from_array(values + values.dtype.type(5.0), tensor.name))
    onnx.save(proto, str(path))
    relist(folder, model)


def relist(folder: Path, file: str) -> None:
    """Write the new size and digest of the package file ``file`` into ``summary.json``'s
    ``contents``: an edit the package's own records agree with."""
    from weightstore.io.digests import digest_file, make_key

    path = folder / file
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_bytes())
    (entry,) = [c for c in summary["contents"] if c["path"] == file]
    algo = entry["digest"].partition(":")[0]
    entry.update(size=path.stat().st_size, digest=make_key(algo, digest_file(algo, path)))
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def as_an_earlier_version_wrote_it(package: Path) -> None:
    """Rewrite a package folder as weightstore before format 4 wrote it: each external
    tensor's ``checksum`` the payload's store key (the summary's ``id`` of its location and
    offset), in the models and the device models, device records of format 1 (no keys),
    ``format_version`` 3, and the changed files' sizes and digests in ``contents``."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    from weightstore.io.digests import digest_file, make_key

    summary_path = package / "summary.json"
    summary = json.loads(summary_path.read_text())
    keys = {m["name"]: {(w["location"], w["offset"]): w["id"] for w in m["external_weights"]}
            for m in summary["models"]}
    changed = [(m["file"], keys[m["name"]]) for m in summary["models"]]
    for record_path in sorted(package.glob("devices/*/bundle.json")):
        record = json.loads(record_path.read_text())
        device = record_path.parent.relative_to(package).as_posix()
        changed += [(f"{device}/{m['file']}", keys[m["name"]]) for m in record["models"]]
        record["format_version"] = 1
        for m in record["models"]:
            m.pop("external_weights", None)
            m.pop("digest", None)  # the model file's digest came later still
        record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        changed.append((f"{device}/bundle.json", None))
    for file, by_range in changed:
        path = package / file
        if by_range is not None:
            proto = onnx.load(path, load_external_data=False)
            for t in _get_all_tensors(proto):
                if uses_external_data(t):
                    info = ExternalDataInfo(t)
                    t.external_data.add(key="checksum",
                                        value=by_range[(info.location, info.offset)])
            path.write_bytes(proto.SerializeToString())
        (entry,) = [c for c in summary["contents"] if c["path"] == file]
        entry.update(size=path.stat().st_size,
                     digest=make_key("blake3", digest_file("blake3", path)))
    summary["format_version"] = 3
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def flip_live_byte(folder: Path, weights: list[dict]) -> str:
    """Flip one byte inside the first of ``weights`` (a record's ``external_weights``)
    whose file ``folder`` holds; returns that weight's name."""
    w = next(w for w in weights if (folder / w["location"]).is_file())
    path = folder / w["location"]
    data = bytearray(path.read_bytes())
    data[w["offset"] + w["size"] // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return w["name"]


def empty_store(root: Path) -> Path:
    """A new, empty weight store at ``root`` (its index created), as a command's
    ``--store`` must name one when it proves a package folder against it."""
    from weightstore.store import WeightStore

    root.mkdir(parents=True, exist_ok=True)
    with WeightStore(root).index.writing():
        pass
    return root


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold ``path`` as a live writer holds its temp file (an exclusive flock on it)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` but for about ``leave`` bytes."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 65536)
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))


# every layout a recipe makes: weights inline, per-weight files (at the root or in
# scenario groups), combined files (per model, shared, or per scenario group)
EVERY_LAYOUT = """\
package: pk
version: "{version}"
store: {{path: {store}}}
models:
  - name: encoder
    source: {src}
    scenarios:
      - {{name: half, passes: [cast-fp16, cleanup], requires: {{accelerator: npu}}}}
layouts:
  - {{name: embedded, external_weight: embedded}}
  - {{name: separate, external_weight: separate}}
  - {{name: combined, external_weight: combined}}
  - {{name: shared, external_weight: combined, combined: shared}}
  - {{name: split, external_weight: combined, split: scenario, alignment: 4096}}
  - {{name: split-sep, external_weight: separate, split: scenario}}
devices:
  - {{name: npu, capabilities: {{accelerator: npu}}, scenario: auto}}
output: {out}
"""


def every_layout(folder: Path, model: onnx.ModelProto, version: str,
                 ) -> dict[str, Path]:
    """Build ``model`` as package pk ``version`` in every layout (and a scenario, a
    device) below ``folder``; layout name -> package folder."""
    import onnx

    from weightstore.builder.run import BuildOptions, build

    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"encoder-{version}.onnx"
    onnx.save(model, str(src))
    recipe = folder / f"recipe-{version}.yaml"
    recipe.write_text(EVERY_LAYOUT.format(version=version, store=folder / "store", src=src,
                                          out=folder / "out"))
    result = build(recipe, BuildOptions(jobs=2))
    return {p.layout: p.path for p in result.packages}


EXAMPLE_RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def build_example(folder: Path, recipe: str) -> Path:
    """Build the repository's recipe ``recipes/<recipe>.yaml`` with its store and output
    in ``folder``; returns the output folder (``<package>/<version>/<layout>`` below)."""
    import yaml

    import weightstore

    doc = yaml.safe_load((EXAMPLE_RECIPES / f"{recipe}.yaml").read_text())
    entries = [*doc.get("files", []), *(f for d in doc.get("devices", [])
                                        for f in d.get("files", []))]
    for entry in [*doc["models"], *entries]:  # local sources, from the recipes' folder
        if isinstance(entry["source"], str):
            entry["source"] = str((EXAMPLE_RECIPES / entry["source"]).resolve())
    doc["store"] = {**doc.get("store", {}), "path": str(folder / "store")}
    doc["output"] = str(folder / "dist")
    path = folder / f"{recipe}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    weightstore.build(path, weightstore.BuildOptions(jobs=2))
    return folder / "dist"


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A server on loopback that accepts every connection and never answers: yields its
    ``127.0.0.1:<port>``; closes every connection it held on exit."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def relocated_away(record):
    """A bundle record without what a device folder relocates: its files' sizes, its
    models' bytes and digests, its live weights' offsets."""
    return {**record, "files": None, "models": [
        {**m, "model_bytes": None, "digest": None, "external_weights": sorted(
            ({**w, "offset": None} for w in m["external_weights"]),
            key=lambda w: (w["location"], w["id"], w["name"]))}
        for m in record["models"]]}


def file_tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative POSIX path, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def manifest_of(ref: str) -> dict:
    """The manifest a registry holds for the reference ``ref``."""
    import json

    from weightstore.registry.client import RegistryClient
    from weightstore.registry.reference import parse_reference

    parsed = parse_reference(ref)
    return json.loads(RegistryClient(parsed.host).get_manifest(parsed)[0])
