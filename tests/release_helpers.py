"""Shared by the release tests: a small checkout (model + recipe) and hostile archives."""

from __future__ import annotations

import contextlib
import io
import json
import locale
import os
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

RECIPE = """\
package: pkg
version: "1.0.0"
store: {{path: store, hash: {hash}}}
models:
  - {{name: encoder, source: models/encoder.onnx}}
layouts:
  - {{name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}}
  - {{name: separate, external_weight: separate, size_threshold: 1024}}
devices:
  - {{name: cpu, scenario: null}}
output: out
"""


def make_checkout(root: Path, model: onnx.ModelProto, hash_algo: str = "blake3") -> Path:
    """A recipe and its model under ``root``; returns the recipe path."""
    (root / "models").mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(root / "models" / "encoder.onnx"))
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(hash=hash_algo))
    return recipe


REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 65534  # nobody


def released_files(checkout: Path) -> dict[str, bytes]:
    """The release folder of :func:`make_checkout`'s recipe, by file name."""
    out = checkout / "out" / "releases" / "pkg-1.0.0"
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def run_as_other_user(warm: Path, checkout: Path, argv: Sequence[str], env: Mapping[str, str],
                      umask: int, uid: int = OTHER_UID) -> dict[str, Any]:
    """Run ``weightstore`` as root in ``warm``, then as ``uid`` in ``checkout``, in one new
    process of this interpreter; returns its report (exit codes, ids, output).

    The other user can run neither this interpreter (often under a private home folder) nor
    read its stdlib, so the process starts as root, loads every lazy import in the run as
    root, then drops to ``uid`` with no supplementary groups and runs the same command
    in-process with its own environment, ``umask``, TZ and locale. Not a fork of the test
    process: blake3's thread pool, once started, does not survive a fork.
    """
    request = {"warm": str(warm), "checkout": str(checkout), "argv": list(argv),
               "env": dict(env), "umask": umask, "uid": uid}
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    full.pop("WEIGHTSTORE_DIR", None)
    done = subprocess.run([sys.executable, "-c", "import sys; from tests.release_helpers "
                           "import _release_twice; _release_twice(sys.argv[1])",
                           json.dumps(request)], env=full, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _release_twice(request_json: str) -> None:
    """The process :func:`run_as_other_user` starts; prints its report as JSON."""
    from weightstore.cli import main

    request = json.loads(request_json)
    argv, uid, umask = request["argv"], request["uid"], request["umask"]
    report: dict[str, Any] = {}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            os.chdir(request["warm"])
            report["warm_exit"] = main(argv)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.environ.clear()
            os.environ.update(request["env"])
            time.tzset()
            locale.setlocale(locale.LC_ALL, "")
            os.umask(umask)
            os.chdir(request["checkout"])
            report.update(uid=os.getuid(), euid=os.geteuid(), gid=os.getgid(),
                          groups=os.getgroups(), umask=os.umask(umask), tz=time.tzname[0],
                          locale=locale.setlocale(locale.LC_ALL))
            report["exit"] = main(argv)
    except BaseException:
        report["error"] = traceback.format_exc()
    report["output"] = out.getvalue()
    print(json.dumps(report))


def tar_zst(members: Sequence[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """An archive made by hand, hostile members included (for unpack tests)."""
    import zstandard

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(buf.getvalue())


def entry(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE,
          **fields) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    if data is not None:
        info.size = len(data)
    for k, v in fields.items():
        setattr(info, k, v)
    return info, data


CHANGED = "encoder.layer.0.attention.self.query.weight"


def build_two_versions(root: Path) -> dict[str, tuple[Path, Path]]:
    """Two builds of one package into one store (``root/store``), as folders and release
    archives: ``a``, and ``b`` with one weight of its encoder changed, a second model and a
    second device. name -> (package folder, archive)."""
    import numpy as np
    from onnx import numpy_helper

    from weightstore.builder.run import BuildOptions, build
    from weightstore.release.api import ReleaseOptions, release

    from .samples import make_encoder

    model = make_encoder(vocab=200, hidden=32, layers=1, ffn=64)
    a = make_checkout(root / "a", model)
    tensor = next(t for t in model.graph.initializer if t.name == CHANGED)
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) + np.float32(1),
                                            CHANGED))
    b = make_checkout(root / "b", model)
    text = b.read_text().replace("devices:\n  - {name: cpu, scenario: null}",
                                 "devices:\n  - {name: cpu, scenario: null}\n"
                                 "  - {name: edge, scenario: null}")
    text = text.replace("  - {name: encoder, source: models/encoder.onnx}",
                        "  - {name: encoder, source: models/encoder.onnx}\n"
                        "  - {name: second, source: models/second.onnx}")
    b.write_text(text)
    onnx.save_model(make_encoder(vocab=100, hidden=16, layers=1, ffn=32, seed=3),
                    str(root / "b" / "models" / "second.onnx"))
    out = {}
    for name, recipe in (("a", a), ("b", b)):
        build(recipe, BuildOptions(jobs=2, store=str(root / "store")))
        rel = release(recipe.parent / "out/pkg/1.0.0/combined",
                      ReleaseOptions(output=str(root / f"rel-{name}"), jobs=2))
        out[name] = (recipe.parent / "out/pkg/1.0.0/combined",
                     rel.output / rel.archives[0].file_name)
    return out


def archive_members(path: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Every member of a release archive with its data (small test archives only)."""
    import zstandard

    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        return [(m, tf.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
                for m in tf.getmembers()]


def tar_bytes(members: Sequence[tuple[tarfile.TarInfo, bytes | None]], *,
              end: bool = True) -> bytes:
    """A tar of ``members``; ``end=False``: without its end-of-archive blocks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
        size = tf.offset
    return buf.getvalue() if end else buf.getvalue()[:size]


def _edited(path: Path, name: str, edit) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The archive's members with the one ending in ``/name`` replaced by ``edit(info,
    data)`` (a list of members)."""
    out = []
    for info, data in archive_members(path):
        out += edit(info, data) if info.name.endswith(f"/{name}") else [(info, data)]
    return out


def _flip_four(info: tarfile.TarInfo, data: bytes | None):
    assert data is not None and len(data) > 100
    return [(info, data[:64] + bytes(b ^ 0x5A for b in data[64:68]) + data[68:])]


def _with(*extra: tuple[tarfile.TarInfo, bytes | None]):
    """Keep the member, then add ``extra``."""
    return lambda info, data: [(info, data), *extra]


def _link_for(info: tarfile.TarInfo, data: bytes | None):
    link = tarfile.TarInfo(info.name)
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return [(link, None)]


# hostile copies of a release archive (:func:`hostile_copies`) -> whether its structure
# alone gives it away (False: only hashing its members does)
HOSTILE_TRICKS = {
    "four weight bytes changed": False, "dot-dot member": True, "absolute member": True,
    "symlink member": True, "hard link member": True, "device member": True,
    "duplicate member with other bytes": True, "a link in place of the model": True,
    "trailing data": True, "a further frame of data": True, "last byte cut": True,
    "frame checksum cut": True, "no end-of-archive blocks": True,
    "one end-of-archive block": True,
}


def hostile_copies(archive: Path) -> dict[str, bytes]:
    """Copies of the release archive ``archive`` (whose package has ``encoder.onnx`` and
    the weight file ``encoder_weight_combined``) that every reader must refuse, by name;
    each is the archive's bytes, to be written under the archive's own file name."""
    import zstandard

    root = archive.name.removesuffix(".tar.zst")
    weights, model = "encoder_weight_combined", "encoder.onnx"

    def z(tar: bytes) -> bytes:
        return zstandard.ZstdCompressor(write_checksum=True).compress(tar)

    def edit(name, how, **kw) -> bytes:
        return z(tar_bytes(_edited(archive, name, how), **kw))

    data = archive.read_bytes()
    out = {
        "four weight bytes changed": edit(weights, _flip_four),
        "dot-dot member": edit(model, _with(entry(f"{root}/../evil.sh", b"#!/bin/sh"))),
        "absolute member": edit(model, _with(entry("/tmp/evil.sh", b"#!/bin/sh"))),
        "symlink member": edit(model, _with(entry(f"{root}/link", kind=tarfile.SYMTYPE,
                                                  linkname="/etc"))),
        "hard link member": edit(model, _with(entry(f"{root}/hard", kind=tarfile.LNKTYPE,
                                                    linkname=f"{root}/{model}"))),
        "device member": edit(model, _with(entry(f"{root}/null", kind=tarfile.CHRTYPE,
                                                 devmajor=1, devminor=3))),
        "duplicate member with other bytes": edit(
            weights, lambda i, d: [(i, d), *_flip_four(i, d)]),
        "a link in place of the model": edit(model, _link_for),
        "trailing data": data + b"appended",
        "a further frame of data": data + z(b"x" * 1000),
        "last byte cut": data[:-1],
        "frame checksum cut": data[:-4],
        "no end-of-archive blocks": z(tar_bytes(archive_members(archive), end=False)),
        "one end-of-archive block": z(tar_bytes(archive_members(archive), end=False)
                                      + bytes(512)),
    }
    assert out.keys() == HOSTILE_TRICKS.keys()
    return out


COMPANION_RECIPE = """\
package: pkg
version: "1.0.0"
store: {path: store, hash: blake3}
models:
  - {name: encoder, source: models/encoder.onnx}
layouts:
  - {name: combined, external_weight: combined, alignment: 512, size_threshold: 1024}
  - {name: separate, external_weight: separate, size_threshold: 1024}
files:
  - source: hf/genai_config.json
  - source: hf/tokenizer.json
  - source: hf/LICENSE
  - {source: hf/extra, path: extra}
devices:
  - name: cpu
    scenario: null
    files: [{source: cpu/genai_config.json, path: genai_config.json}]
  - {name: edge, scenario: null}
output: out
"""
# a companion's text may hold anything: markup a page must show as text, never run
HOSTILE_TEXT = "</script><img src=x onerror=\"console.error(1)\"><!--<script>&amp;\u00e9"


def companion_sources(version: int = 1) -> dict[str, bytes]:
    """The companion files of :func:`make_companion_checkout`, by path in the package
    (``devices/cpu/genai_config.json``: the cpu device's own ``genai_config.json``)."""
    vocab = {f"tok{i}": i for i in range(600 + 40 * version)}
    files = {
        "genai_config.json": json.dumps({"model": {"type": "llama", "context_length": 128},
                                         "search": {"max_length": 64 * version}},
                                        indent=2).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE",
                                                                  "vocab": vocab}},
                                     indent=1).encode(),
        "LICENSE": f"Sample licence {HOSTILE_TEXT}\n".encode(),
        "extra/merges.txt": b"#version: 0.2\nt o\nto k\n",
        "extra/blob.bin": bytes(range(256)) * (4 + version),
        "devices/cpu/genai_config.json": json.dumps(
            {"model": {"type": "llama"}, "provider": "cpu", "threads": version}).encode(),
    }
    if version == 2:
        del files["LICENSE"]
        files["README.md"] = b"# pkg\n\nA model card.\n"
    return files


def make_companion_checkout(root: Path, model: onnx.ModelProto, version: int = 1) -> Path:
    """A recipe with companion files (top-level ``files``, a folder among them, the cpu
    device's own genai_config.json), its model and the files' sources under ``root``;
    returns the recipe path. ``version=2``: tokenizer.json, both genai_config.json and
    extra/blob.bin changed, LICENSE gone, README.md new."""
    recipe = make_checkout(root, model)
    text = COMPANION_RECIPE
    if version == 2:
        text = text.replace("  - source: hf/LICENSE\n", "  - source: hf/README.md\n")
    recipe.write_text(text)
    for path, data in companion_sources(version).items():
        source = root / ("cpu/genai_config.json" if path.startswith("devices/")
                         else f"hf/{path}")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
    return recipe
