"""Push and pull through a real OCI registry on loopback, against the transport's limit.

Figures (medians of ``--runs`` interleaved runs; the machine is shared, so they are noisy):

- push and pull of a ``--size-mb`` package (combined layout, 16 MB tensors) against the
  transport's limit measured in the same run with the same HTTP client (the registry
  client's, ``weightstore.io.http``):
  one streaming PUT of the package's weight file as a single blob, and one streaming GET of
  it into a file. Target: push and pull throughput >= 0.8x the limit (so the time ratio
  below is <= 1.25).
- bytes uploaded for a one-tensor update (an encoder, version 1.0.1 changing one weight
  matrix), against the changed payload bytes. Target <= 1.05 for the weight blobs; all
  bytes sent (models, summary, config and manifests included) are shown
  for scale.
- bytes fetched by a device pull, against the device's live bytes (``bundle.json``).
  Target = 1.00.
- whole-process ``weightstore pull`` and ``weightstore push`` of a MiniLM-sized package
  (a generated transformer export: 6 layers of hidden 384, the embedding table filling it
  to ``--peer-mb``, about 100 weights; under 40 MB, one layer of hidden 128, about 20
  weights, where start-up dominates), separate and combined layouts, against skopeo
  copying the same artifact in the same round: ``skopeo copy docker://... oci:DIR`` for a
  pull (into an empty store), ``skopeo copy oci:DIR docker://...`` for a push (into a
  fresh registry). Target: pull <= 1.3x skopeo, push <= 1.0x skopeo. Skipped, with a
  message, where skopeo is not installed. Beside them, for scale, ``pull_floor.py``: a
  Python process that only downloads the same blobs (``http.client``, sha256, fsync, as
  skopeo's copy does: no store, no package folder), the floor any pull in Python stands
  on.
- pulls through a pull-through cache (distribution's ``proxy`` mode, a second registry in
  front of the origin) named the origin's mirror in ``registries.conf``, the separate
  layout of the same package: what the origin served (requests, bytes, blob GETs, behind
  a counting proxy) while 4 nodes pulled at once through a cold cache and during the warm
  pulls; then the warm pull through the cache against the same pull from the origin and
  against ``skopeo copy`` through the same cache with the same ``registries.conf``.

Every run starts a fresh registry (its own storage folder) and a fresh local store, so
nothing is skipped or mounted. Run as ``python bench/registry.py``; needs the
``docker-registry`` binary (Debian's CNCF distribution registry). ``--part peer`` runs only
the comparison with skopeo (``throughput``, ``bytes`` and ``mirror`` the other parts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

sys.path.insert(0, str(harness.REPO))

from tests.registry_server import BINARY, RegistryServer

SKOPEO = shutil.which("skopeo")
FLOOR = Path(__file__).with_name("pull_floor.py")

RECIPE = """\
package: {package}
version: "{version}"
store: {{path: {store}, hash: {hash}}}
models:
  - name: {model}
    source: {source}
{scenarios}layouts:
  - {{name: release, external_weight: combined}}
{devices}output: {out}
"""


def build_package(workdir: Path, name: str, model: Any, version: str, hash_: str,
                  scenario: bool = False) -> Path:
    from weightstore.builder.run import BuildOptions, build

    src = workdir / f"{name}-{version}.onnx"
    import onnx

    onnx.save(model, str(src))
    recipe = workdir / f"{name}-{version}.yaml"
    recipe.write_text(RECIPE.format(
        package=name, version=version, store=workdir / f"{name}-store", hash=hash_,
        model=name, source=src, out=workdir / "out",
        scenarios=("    scenarios:\n      - {name: half, passes: [cast-fp16, cleanup], "
                   "requires: {accelerator: npu}}\n") if scenario else "",
        devices=("devices:\n  - {name: npu, capabilities: {accelerator: npu}, "
                 "scenario: auto}\n") if scenario else ""))
    (result,) = build(recipe, BuildOptions(jobs=4)).packages
    return result.path


def fresh_registry(workdir: Path, name: str) -> RegistryServer:
    folder = workdir / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return RegistryServer(folder).start()


def transport_limit(host: str, path: Path) -> tuple[float, float]:
    """Seconds for one streaming PUT, then one streaming GET, of ``path`` as one blob,
    with the client's own plumbing (weightstore.io.http, 1 MiB pieces), no hashing."""
    from weightstore.registry.client import CHUNK, RegistryClient, Transport
    from weightstore.registry.push import file_pieces
    from weightstore.registry.reference import parse_reference

    size = path.stat().st_size
    # the digest is needed by the protocol; computed before the clock starts
    import hashlib

    h = hashlib.sha256()
    for piece in file_pieces(path)(0, size):
        h.update(piece)
    digest = "sha256:" + h.hexdigest()
    client = RegistryClient(host, Transport(chunk_size=size + 1))
    ref = parse_reference(f"{host}/raw/blob:1")
    start = time.perf_counter()
    location = client.start_upload(ref, digest)
    client.put_monolithic(ref, location, digest, size, file_pieces(path))
    put = time.perf_counter() - start
    out = path.parent / "raw-get.bin"
    start = time.perf_counter()
    with client.open_blob(ref, digest) as resp, open(out, "wb") as f:
        for data in iter(lambda: resp.read1(CHUNK), b""):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    get = time.perf_counter() - start
    out.unlink()
    return put, get


def throughput_runs(workdir: Path, size_mb: int, runs: int) -> dict[str, Any]:
    from tests.samples import make_large_model
    from weightstore.registry.pull import pull
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    harness.log(f"building a {size_mb} MB package ...")
    package = build_package(workdir, "big", make_large_model(size_mb * harness.MB), "1",
                            "sha256")
    weight_file = package / "big_weight_combined"
    store = WeightStore(workdir / "big-store")
    times: dict[str, list[float]] = {"put": [], "get": [], "push": [], "pull": []}
    for i in range(runs):
        harness.log(f"round {i + 1}/{runs}")
        server = fresh_registry(workdir, "reg-raw")
        try:
            put, get = transport_limit(server.host, weight_file)
        finally:
            server.stop()
        times["put"].append(put)
        times["get"].append(get)
        server = fresh_registry(workdir, "reg-pkg")
        try:
            ref = f"{server.host}/bench/big:1"
            with store.index.writing() as conn:  # forget where blobs were: no mounts
                conn.execute("DELETE FROM blob_repos") if _has(conn, "blob_repos") else None
            start = time.perf_counter()
            push(package, ref, store=store)
            times["push"].append(time.perf_counter() - start)
            target = workdir / "pulled"
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(workdir / "pull-store", ignore_errors=True)
            start = time.perf_counter()
            pull(ref, target, store=WeightStore(workdir / "pull-store"))
            times["pull"].append(time.perf_counter() - start)
        finally:
            server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    size = sum(p.stat().st_size for p in package.rglob("*") if p.is_file())
    return {"package_bytes": size, "weight_file_bytes": weight_file.stat().st_size,
            "seconds": times, "median": med,
            "push_vs_put": med["push"] / med["put"], "pull_vs_get": med["pull"] / med["get"]}


def _has(conn: Any, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() \
        is not None


def byte_figures(workdir: Path) -> dict[str, Any]:
    from onnx import numpy_helper

    from tests.samples import make_encoder
    from weightstore.registry.pull import pull
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    model = make_encoder(hidden=256, ffn=1024, layers=4, vocab=8000)
    v1 = build_package(workdir, "enc", model, "1.0.0", "blake3", scenario=True)
    changed = type(model)()
    changed.CopyFrom(model)
    for t in changed.graph.initializer:
        if t.name == "encoder.layer.2.attention.output.dense.weight":
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 1.5, t.name))
    v2 = build_package(workdir, "enc", changed, "1.0.1", "blake3", scenario=True)
    server = fresh_registry(workdir, "reg-bytes")
    for name in ("npu", "npu2", "dev"):  # left by an earlier run in a kept workdir
        shutil.rmtree(workdir / name, ignore_errors=True)
    try:
        store = WeightStore(workdir / "enc-store")
        ref = f"{server.host}/bench/enc"
        push(v1, f"{ref}:1.0.0", store=store)
        update = push(v2, f"{ref}:1.0.1", store=store)
        old, new = (_payloads(v) for v in (v1, v2))
        changed_bytes = sum(n for k, n in new.items() if k not in old)
        metadata = update.sent_bytes - update.uploaded_weight_bytes  # incl. manifests
        device = pull(f"{ref}:1.0.0", workdir / "npu", store=WeightStore(workdir / "dev"),
                      device="npu")
        bundle = json.loads((v1 / "devices" / "npu" / "bundle.json").read_text())
        live = sum(m["live_bytes"] for m in bundle["models"])
        device_update = pull(f"{ref}:1.0.1", workdir / "npu2",
                             store=WeightStore(workdir / "dev"), device="npu")
    finally:
        server.stop()
    return {
        "package_payload_bytes": sum(new.values()),
        "update_changed_payload_bytes": changed_bytes,
        "update_uploaded_weight_bytes": update.uploaded_weight_bytes,
        "update_sent_bytes": update.sent_bytes,
        "update_metadata_bytes": metadata,
        "update_sent_vs_changed": update.sent_bytes / changed_bytes,
        "update_weight_ratio": update.uploaded_weight_bytes / changed_bytes,
        "device_live_bytes": live,
        "device_fetched_bytes": device.fetched_bytes,
        "device_ratio": device.fetched_bytes / live,
        "device_update_fetched_bytes": device_update.fetched_bytes,
    }


def _payloads(folder: Path) -> dict[str, int]:
    summary = json.loads((folder / "summary.json").read_text())
    return {w["id"]: w["size"] for m in summary["models"] for w in m["external_weights"]}


PEER_RECIPE = """\
package: mini
version: "1.0.0"
store: {{path: {store}}}
models:
  - {{name: mini, source: {source}}}
layouts:
  - {{name: separate, external_weight: separate}}
  - {{name: combined, external_weight: combined}}
output: {out}
"""


SMALL_MB = 40  # a package under this many MB is a small one (see transformer_packages)


def transformer_packages(workdir: Path, size_mb: int) -> dict[str, Path]:
    """A MiniLM-shaped export (6 layers of hidden 384, ffn 1536: embeddings, attention and
    MLP matrices, layer norms; the word embeddings fill it to ``size_mb``), built into a
    separate and a combined layout; layout name -> package folder. Under
    :data:`SMALL_MB`, where start-up dominates, one layer of hidden 128 (ffn 512) instead:
    about 20 weights, the embeddings filling it to ``size_mb``."""
    import onnx

    from tests.samples import make_encoder
    from weightstore.builder.run import BuildOptions, build

    layers, hidden, ffn, heads = (6, 384, 1536, 6) if size_mb >= SMALL_MB else (1, 128, 512, 4)
    per_layer = 4 * (4 * hidden * hidden + 2 * hidden * ffn)
    vocab = max(1000, (size_mb * harness.MB - layers * per_layer) // (4 * hidden))
    model = make_encoder(vocab=vocab, hidden=hidden, heads=heads, layers=layers, ffn=ffn,
                         max_seq=512, name="mini")
    source = workdir / "mini.onnx"
    onnx.save(model, str(source))
    recipe = workdir / "mini.yaml"
    recipe.write_text(PEER_RECIPE.format(store=workdir / "mini-store", source=source,
                                         out=workdir / "out"))
    return {p.layout: p.path for p in build(recipe, BuildOptions(jobs=2)).packages}


def _weightstore(*argv: str) -> list[str]:
    return [sys.executable, "-m", "weightstore", *argv]


def _skopeo(*argv: str) -> list[str]:
    assert SKOPEO is not None
    return [SKOPEO, "copy", "-q", *argv]


def _timed(argv: list[str], workdir: Path, name: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of ``argv`` as a whole process."""
    proc = harness.run_process(argv, workdir, name)
    return proc.seconds, proc.cpu_seconds


def peer_runs(workdir: Path, size_mb: int, runs: int) -> dict[str, Any]:
    """Whole-process push and pull against skopeo's copies of the same artifact, each
    round on a fresh registry, the order of the two alternating between rounds."""
    harness.log(f"building a {size_mb} MB transformer package ...")
    packages = transformer_packages(workdir, size_mb)
    store = workdir / "mini-store"
    weights = {layout: len(json.loads((folder / "summary.json").read_text())["models"][0]
                           ["external_weights"]) for layout, folder in packages.items()}
    names = ("pull", "skopeo-pull", "python-floor", "push", "skopeo-push")
    times: dict[str, dict[str, list[float]]] = {
        layout: {n: [] for n in names} for layout in packages}
    cpu: dict[str, dict[str, list[float]]] = {
        layout: {n: [] for n in names} for layout in packages}
    run_dir = workdir / "runs"
    for i in range(runs):
        for layout, folder in packages.items():
            harness.log(f"round {i + 1}/{runs}, {layout}")
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir()
            oci = run_dir / "oci"
            server = fresh_registry(workdir, "reg-peer")
            try:  # the artifact pulled, by weightstore and by skopeo
                ref = f"{server.host}/bench/mini:{layout}"
                harness.run_process(_weightstore("push", str(folder), ref, "--store", str(store)),
                                    workdir, "setup-push")
                pulls = [("pull", _weightstore("pull", ref, str(run_dir / "pulled"), "--store",
                                                 str(run_dir / "pull-store"))),
                         ("skopeo-pull", _skopeo("--src-tls-verify=false", f"docker://{ref}",
                                                 f"oci:{oci}")),
                         ("python-floor", [sys.executable, str(FLOOR), ref,
                                           str(run_dir / "floor")])]
                for name, argv in pulls if i % 2 == 0 else pulls[::-1]:
                    wall, used = _timed(argv, workdir, name)
                    times[layout][name].append(wall)
                    cpu[layout][name].append(used)
            finally:
                server.stop()
            pushes = [("push", folder, _weightstore("push", str(folder), "{ref}", "--store",
                                                      str(store))),
                      ("skopeo-push", oci, _skopeo("--dest-tls-verify=false", f"oci:{oci}",
                                                   "docker://{ref}"))]
            for name, _, argv in pushes if i % 2 == 0 else pushes[::-1]:
                server = fresh_registry(workdir, "reg-peer")  # nothing there to skip
                try:
                    ref = f"{server.host}/bench/mini:{layout}"
                    wall, used = _timed([a.replace("{ref}", ref) for a in argv], workdir, name)
                    times[layout][name].append(wall)
                    cpu[layout][name].append(used)
                finally:
                    server.stop()
    med = {layout: {n: statistics.median(v) for n, v in t.items()}
           for layout, t in times.items()}
    med_cpu = {layout: {n: statistics.median(v) for n, v in t.items()}
               for layout, t in cpu.items()}
    return {"package_bytes": {layout: sum(p.stat().st_size for p in folder.rglob("*")
                                          if p.is_file())
                              for layout, folder in packages.items()},
            "weights": weights, "seconds": times, "median": med,
            "cpu_seconds": cpu, "median_cpu": med_cpu,
            "pull_vs_skopeo": {k: m["pull"] / m["skopeo-pull"] for k, m in med.items()},
            "push_vs_skopeo": {k: m["push"] / m["skopeo-push"] for k, m in med.items()},
            "pull_cpu_vs_skopeo": {k: m["pull"] / m["skopeo-pull"]
                                   for k, m in med_cpu.items()},
            "floor_vs_skopeo": {k: m["python-floor"] / m["skopeo-pull"]
                                for k, m in med.items()},
            "pull_vs_floor": {k: m["pull"] / m["python-floor"] for k, m in med.items()},
            "push_cpu_vs_skopeo": {k: m["push"] / m["skopeo-push"]
                                   for k, m in med_cpu.items()},
            "skopeo": subprocess.run([SKOPEO, "--version"], capture_output=True, text=True,
                                     check=False).stdout.strip() if SKOPEO else None}


def peer_targets(p: dict[str, Any]) -> list[harness.Target]:
    return [target
            for layout in p["median"]
            for target in (
                harness.Target(f"{layout}: pull / skopeo pull", p["pull_vs_skopeo"][layout], 1.3),
                harness.Target(f"{layout}: push / skopeo push", p["push_vs_skopeo"][layout],
                               1.0),
                harness.Target(f"{layout}: pull CPU / skopeo pull CPU",
                               p["pull_cpu_vs_skopeo"][layout], None),
                harness.Target(f"{layout}: python floor / skopeo pull",
                               p["floor_vs_skopeo"][layout], None),
                harness.Target(f"{layout}: pull / python floor", p["pull_vs_floor"][layout],
                               None),
                harness.Target(f"{layout}: push CPU / skopeo push CPU",
                               p["push_cpu_vs_skopeo"][layout], None))]


def peer_text(p: dict[str, Any], runs: int) -> list[str]:
    lines = [f"whole process against {p['skopeo']}, {runs} rounds, medians (s)"]
    for layout, med in p["median"].items():
        lines.append(f"  {layout} ({p['package_bytes'][layout] / harness.MB:.0f} MB, "
                     f"{p['weights'][layout]} weights): "
                     + ", ".join(f"{name} {value:.3f}" for name, value in med.items()))
        lines.append("    CPU (user + system): " + ", ".join(
            f"{name} {value:.3f}" for name, value in p["median_cpu"][layout].items()))
    return lines


MIRROR_CLIENTS = 4


def _counting_front(upstream: str, log: list[tuple[str, str, int]]) -> Any:
    """A proxy in front of ``upstream`` recording (method, path, body bytes answered) of
    every request: what the origin served."""
    from tests.registry_proxy import answer, forward, misbehaving

    def intercept(handler: Any, body: bytes) -> bool:
        status, headers, data = forward(handler, upstream, body)
        answer(handler, status, headers, data)
        log.append((handler.command, handler.path,
                     0 if handler.command == "HEAD" else len(data)))
        return True

    return misbehaving(upstream, intercept)


def _served(log: list[tuple[str, str, int]]) -> dict[str, Any]:
    blobs = [(m, p, n) for m, p, n in log if "/blobs/" in p]
    return {"requests": len(log), "bytes": sum(n for _, _, n in log),
            "blob_gets": sum(1 for m, _, _ in blobs if m == "GET"),
            "blob_bytes": sum(n for _, _, n in blobs),
            "manifest_requests": sum(1 for _, p, _ in log if "/manifests/" in p)}


def mirror_runs(workdir: Path, size_mb: int, runs: int) -> dict[str, Any]:
    """Pulls through distribution's pull-through cache (a second registry with ``proxy:
    {remoteurl: ...}``) named the origin's mirror in registries.conf: what the origin
    serves for ``MIRROR_CLIENTS`` nodes pulling at once through a cold cache, then the
    warm pull against the same pull from the origin and against skopeo through the same
    cache with the same registries.conf."""
    from concurrent.futures import ThreadPoolExecutor

    folder = transformer_packages(workdir, size_mb)["separate"]
    store = workdir / "mini-store"
    names = ("mirror", "origin", "skopeo-mirror")
    times: dict[str, list[float]] = {n: [] for n in names}
    served: list[dict[str, Any]] = []
    payload = 0
    for i in range(runs):
        harness.log(f"mirror round {i + 1}/{runs}")
        run_dir = workdir / "mirror-runs"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir()
        origin = fresh_registry(workdir, "reg-origin")
        log: list[tuple[str, str, int]] = []
        try:
            harness.run_process(_weightstore("push", str(folder), f"{origin.host}/bench/mini:1",
                                             "--store", str(store)), workdir, "setup-push")
            with _counting_front(origin.host, log) as front:
                cache = RegistryServer(_fresh(workdir / "reg-cache"),
                                       proxy=f"http://{front}").start()
                try:
                    conf = run_dir / "registries.conf"
                    conf.write_text(f'[[registry]]\nlocation = "{front}"\n'
                                    f'[[registry.mirror]]\nlocation = "{cache.host}"\n'
                                    'insecure = true\n')
                    (run_dir / "empty.conf").write_text("")
                    through = {"CONTAINERS_REGISTRIES_CONF": str(conf)}
                    ref = f"{front}/bench/mini:1"

                    nodes = [_weightstore("pull", ref, str(run_dir / f"node{n}"), "--store",
                                          str(run_dir / f"node{n}-store"))
                             for n in range(MIRROR_CLIENTS)]
                    with ThreadPoolExecutor(MIRROR_CLIENTS) as pool:
                        for f in [pool.submit(harness.run_process, a, workdir, f"node{n}",
                                              env=through) for n, a in enumerate(nodes)]:
                            f.result()
                    time.sleep(2)  # the cache stores what it streamed in the background
                    served.append(_served(log))
                    payload = sum(p.stat().st_size for p in (run_dir / "node0").rglob("*")
                                  if p.is_file())
                    runs_of = [
                        ("mirror", _weightstore("pull", ref, str(run_dir / "warm"), "--store",
                                                str(run_dir / "warm-store")), through),
                        ("origin", _weightstore("pull", f"{origin.host}/bench/mini:1",
                                                str(run_dir / "direct"), "--store",
                                                str(run_dir / "direct-store")),
                         {"CONTAINERS_REGISTRIES_CONF": str(run_dir / "empty.conf")}),
                        ("skopeo-mirror",  # skopeo 1.9 reads no CONTAINERS_REGISTRIES_CONF
                         [SKOPEO, "--registries-conf", str(conf), "copy", "-q",
                          "--src-tls-verify=false", f"docker://{ref}", f"oci:{run_dir / 'oci'}"],
                         through)]
                    warm = served[-1]["warm"] = {}
                    for name, argv, env in runs_of if i % 2 == 0 else runs_of[::-1]:
                        log.clear()
                        proc = harness.run_process(argv, workdir, name, env=env)
                        times[name].append(proc.seconds)
                        warm[name] = _served(log)
                finally:
                    cache.stop()
        finally:
            origin.stop()
    med = {n: statistics.median(v) for n, v in times.items() if v}
    return {"package_bytes": payload, "clients": MIRROR_CLIENTS, "origin_served": served,
            "seconds": times, "median": med,
            "mirror_vs_origin": med["mirror"] / med["origin"],
            "mirror_vs_skopeo": med["mirror"] / med["skopeo-mirror"]}


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def mirror_targets(m: dict[str, Any]) -> list[harness.Target]:
    return [harness.Target("warm pull via cache / from origin", m["mirror_vs_origin"], None),
            harness.Target("warm pull via cache / skopeo via cache", m["mirror_vs_skopeo"],
                           None)]


def mirror_text(m: dict[str, Any], runs: int) -> list[str]:
    lines = [f"pull-through cache, {m['package_bytes'] / harness.MB:.0f} MB package, "
             f"{runs} rounds, warm medians (s): " + ", ".join(
                 f"{name} {value:.3f}" for name, value in m["median"].items())]
    for i, s in enumerate(m["origin_served"]):
        lines.append(f"  round {i + 1}: the origin served {m['clients']} nodes pulling at "
                     f"once through a cold cache {s['requests']} requests, {s['bytes']} B "
                     f"({s['blob_gets']} blob GETs, {s['blob_bytes']} B of blobs, "
                     f"{s['manifest_requests']} manifest requests); warm, through the "
                     "counting proxy: " + ", ".join(
                         f"{name} {w['requests']} requests, {w['bytes']} B"
                         for name, w in s["warm"].items()))
    return lines


def run(workdir: Path, size_mb: int, runs: int, as_json: bool, part: str = "all",
        peer_mb: int = 90) -> int:
    found: dict[str, Any] = {}
    targets: list[harness.Target] = []
    text: list[str] = []
    if part in ("all", "throughput"):
        t = found["throughput"] = throughput_runs(workdir, size_mb, runs)
        targets += [harness.Target("push time / one streaming PUT", t["push_vs_put"], 1.25),
                    harness.Target("pull time / one streaming GET", t["pull_vs_get"], 1.25)]
        med = t["median"]
        mb = t["package_bytes"] / harness.MB
        text.append(f"package {mb:.0f} MB, {runs} runs, medians (noisy shared machine)")
        text += [f"  {name:>5}: {med[name]:6.2f} s  {mb / med[name]:7.1f} MB/s"
                 for name in ("put", "push", "get", "pull")]
    if part in ("all", "bytes"):
        b = found["bytes"] = byte_figures(workdir)
        targets += [
            harness.Target("update: all bytes sent / changed payloads",
                           b["update_sent_vs_changed"], None, 3),
            harness.Target("update weight bytes / changed", b["update_weight_ratio"], 1.05, 3),
            harness.Target("device fetched / live bytes", b["device_ratio"], 1.0, 3)]
        text.append(f"one-tensor update: changed payloads {b['update_changed_payload_bytes']} "
                    f"B, weights uploaded {b['update_uploaded_weight_bytes']} B, all bytes "
                    f"sent {b['update_sent_bytes']} B (metadata {b['update_metadata_bytes']} "
                    f"B); package payloads {b['package_payload_bytes']} B")
        text.append(f"device pull: live {b['device_live_bytes']} B, fetched "
                    f"{b['device_fetched_bytes']} B; 1.0.0 -> 1.0.1 on the device fetched "
                    f"{b['device_update_fetched_bytes']} B")
    skopeo_parts = (("peer", "the comparison with skopeo", peer_runs, peer_targets,
                     peer_text),
                    ("mirror", "the pull-through cache part", mirror_runs, mirror_targets,
                     mirror_text))
    for name, what, measure, name_targets, describe in skopeo_parts:
        if part not in ("all", name):
            continue
        if SKOPEO is None:
            harness.log(f"bench: skopeo is not installed: {what} is skipped (Debian "
                        "package 'skopeo')")
            continue
        figures = found[name] = measure(workdir, peer_mb, runs)
        targets += name_targets(figures)
        text += describe(figures, runs)
    if as_json:
        found["targets"] = [x.as_json() for x in targets]
        print(json.dumps(found, indent=2, sort_keys=True))
        return 0
    print("\n".join([*text, "", *harness.target_table(targets, "figure", 42, 10)]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--peer-mb", type=int, default=90,
                        help="size of the transformer package compared with skopeo")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--part", choices=("all", "throughput", "bytes", "peer", "mirror"),
                        default="all", help="which figures to measure (default all)")
    harness.add_common_arguments(parser, "the packages, stores and registries")
    args = parser.parse_args(argv)
    if BINARY is None:
        print("bench: error: docker-registry is not installed", file=sys.stderr)
        return 2
    code = harness.in_workdir(args.workdir, args.keep,
                              lambda w: run(w, args.size_mb, args.runs, args.json, args.part,
                                            args.peer_mb))
    return 0 if code is None else code


if __name__ == "__main__":
    sys.exit(main())
