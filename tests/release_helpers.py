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
