"""Two CI runners and one registry: runner B's build from the signed build cache, against
a plain ``weightstore pull`` of the same packages and against its own cold build.

Usage: ``python bench/ci_cache.py [--runs 5] [--workdir DIR] [--keep] [--json]``

Needs Debian's ``docker-registry`` (the tests' registry, started on 127.0.0.1). The model
is a MiniLM-sized transformer export (``tests.samples.make_encoder``: 6 layers of hidden
384, ffn 1536, a 30522-word vocabulary: about 90 MB in ~100 weights) with a ``cast-fp16``
scenario (``half``), built in three layouts (separate; combined, 512-aligned; combined,
4096-aligned, split by scenario). Runner A builds it once with ``--cache-to`` (signing
the entries). Then, ``--runs`` rounds, each process fresh and each runner with an empty
store, checkout and user cache of its own:

* ``cache``: runner B's ``weightstore build RECIPE --cache-from REPO`` (A's key trusted);
* ``pull``: ``weightstore pull`` of the three packages into an empty store, one process
  each, run back to back (what B would do without the build cache: the same packages,
  by the digests the entries sign);
* ``cold``: runner B's own build, no cache;
* ``floor``: what any cached build must do at least, with no Python and no checks: curl
  (``--parallel``) fetches every blob of the three packages once into a folder (the
  store's copy), ``cp`` and ``cat`` write the three layouts from it (the per-weight
  files; each combined file as the blobs back to back, without padding), and ``sync``
  fsyncs every file, as a build does. Needs curl; skipped without it.

Targets: cache <= 1.2x pull (wall time, medians); cold >= 5x cache; bytes the cached
build read from the registry = 1.00x the packages' unique payload bytes plus their
manifests, records and small files (shown apart); the recipe pins the model by its URL
and SHA-256 (served on loopback), and a cached build fetches 0 bytes of it. Shown for
scale: cold / floor, the most cold / cache could be here. A measurement, not a gate: the
exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import harness
from harness import MB, Target

DEFAULT_RUNS = 5
MODES = ("cache", "pull", "cold")
FLOOR = r"""set -e
w=$1
curl -s --fail --parallel --parallel-max 8 -K "$w/urls.txt"
cp -r "$w/blobs" "$w/separate"
cat "$w"/blobs/* > "$w/combined"
cat "$w"/blobs/* > "$w/split"
sync "$w"/blobs/* "$w"/separate/* "$w/combined" "$w/split"
"""

GENERATE = r'''
import sys
from pathlib import Path
import onnx
sys.path.insert(0, sys.argv[2])
from tests.samples import make_encoder
model = make_encoder(vocab=30522, hidden=384, heads=12, layers=6, ffn=1536, max_seq=512,
                     name="mini")
onnx.save(model, sys.argv[1])
'''

RECIPE = """package: mini
version: "1"
store: {{path: store}}
models:
  - name: mini
    source: {{url: "{url}", sha256: "{sha256}"}}
    scenarios:
      - {{name: half, passes: [cast-fp16, cleanup]}}
layouts:
  - {{name: separate, external_weight: separate}}
  - {{name: combined, external_weight: combined, alignment: 512}}
  - {{name: split, external_weight: combined, alignment: 4096, split: scenario}}
devices:
  - {{name: cpu, scenario: null}}
  - {{name: fp16, scenario: half}}
output: out
"""


def _weightstore(*argv: str) -> list[str]:
    return [sys.executable, "-m", "weightstore", *argv]


def _checkout(workdir: Path, name: str, source: dict[str, str]) -> Path:
    folder = workdir / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "recipe.yaml").write_text(RECIPE.format(**source))
    return folder


class _SourceServer:
    """The model file on a loopback HTTP server, counting the bytes it sends."""

    def __init__(self, path: Path) -> None:
        import hashlib
        import http.server
        import threading

        self.sent = 0
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(path.parent), **kwargs)

            def do_GET(self) -> None:
                server.sent += path.stat().st_size
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.source = {"url": f"http://127.0.0.1:{self.httpd.server_address[1]}/{path.name}",
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}

    def close(self) -> None:
        self.httpd.shutdown()
        self.thread.join()


def _env(folder: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(folder / "user-cache"),
            "XDG_CONFIG_HOME": str(folder / "user-config"),
            "WEIGHTSTORE_DIR": str(folder / "default-store"), **(extra or {})}


def run_all(runs: int, workdir: Path) -> dict[str, Any]:
    sys.path.insert(0, str(harness.REPO))
    from tests.registry_server import BINARY, running_registry

    if BINARY is None:
        raise harness.BenchError("needs Debian's docker-registry (apt-get install "
                                 "docker-registry)")
    source = workdir / "mini.onnx"
    if not source.is_file():
        harness.log("generating the transformer ...")
        harness.run_process([sys.executable, "-c", GENERATE, str(source), str(harness.REPO)],
                            workdir, "generate")
    from weightstore.signing.keys import generate

    key = workdir / "ci.pem"
    if not key.exists():
        generate(key)
    from weightstore.signing.keys import load_private

    public = load_private(key).public.text
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in (*MODES, "floor")}
    served = _SourceServer(source)
    pinned = served.source  # every runner's recipe pins the model by its URL and digest
    with running_registry(workdir / "registry") as registry:
        repo = f"{registry.host}/cache/mini"
        harness.log("runner A: cold build, filling the cache ...")
        a = _checkout(workdir, "runner-a", pinned)
        harness.run_process(_weightstore("build", str(a / "recipe.yaml"), "--cache-to", repo,
                                         "--cache-key", str(key)), workdir, "runner-a",
                            cwd=a, env=_env(a))
        built = json.loads(harness.run_process(
            _weightstore("build", str(a / "recipe.yaml"), "--json"), workdir, "runner-a-json",
            cwd=a, env=_env(a)).output)
        packages = [(p["layout"], p["summary"]) for p in built["packages"]]
        payload = {w["id"]: w["size"] for _, s in packages for m in s["models"]
                   for w in m["external_weights"]}
        unique_payload = sum(payload.values())
        digests = _manifest_digests(repo, packages)
        blobs = _blob_urls(registry.host, repo, digests) if shutil.which("curl") else None
        for n in range(runs):
            harness.log(f"round {n + 1}/{runs}")
            for mode in MODES:
                b = _checkout(workdir, f"runner-b-{mode}", pinned)
                env = _env(b, {"WEIGHTSTORE_TRUSTED_KEYS": public})
                if mode == "pull":
                    seconds = cpu = 0.0
                    received = 0
                    for layout, digest in digests.items():
                        proc = harness.run_process(_weightstore(
                            "pull", f"{repo}@{digest}", str(b / "pulled" / layout), "--json"),
                            workdir, f"pull-{layout}", cwd=b, env=env)
                        seconds += proc.seconds
                        cpu += proc.cpu_seconds
                        received += json.loads(proc.output)["received_bytes"]
                    results[mode].append({"seconds": seconds, "cpu": cpu,
                                          "received": received})
                    if blobs is not None:
                        results["floor"].append(_floor(workdir, blobs))
                    continue
                argv = ["build", str(b / "recipe.yaml"), "--json"]
                if mode == "cache":
                    argv += ["--cache-from", repo]
                sent = served.sent
                proc = harness.run_process(_weightstore(*argv), workdir, f"{mode}-build",
                                           cwd=b, env=env)
                out = json.loads(proc.output)
                row = {"seconds": proc.seconds, "cpu": proc.cpu_seconds,
                       "received": sum(p["cache_bytes"] for p in out["packages"]),
                       "source_bytes": served.sent - sent,
                       "fetched": [p["cache"] is not None for p in out["packages"]]}
                if mode == "cache" and not all(row["fetched"]):
                    raise harness.BenchError(f"runner B missed the cache: {row['fetched']}")
                results[mode].append(row)
    served.close()
    return {"runs": runs, "results": results, "unique_payload_bytes": unique_payload,
            "layouts": [layout for layout, _ in packages]}


def _manifest_digests(repo: str, packages: list[tuple[str, dict]]) -> dict[str, str]:
    """Each layout's package manifest digest, as its cache entry signs it."""
    import hashlib

    from weightstore.builder.remote_cache import _entry
    from weightstore.registry.client import RegistryClient
    from weightstore.registry.reference import parse_reference

    out = {}
    for layout, summary in packages:
        ref = parse_reference(_entry(repo, summary["fingerprint"]))
        data, _ = RegistryClient(ref.host).get_manifest(ref)
        out[layout] = "sha256:" + hashlib.sha256(data).hexdigest()
    return out


def _blob_urls(host: str, repo: str, digests: dict[str, str]) -> list[tuple[str, int]]:
    """Every blob of the three packages' manifests, once: (URL, size)."""
    from weightstore.io.files import parse_json
    from weightstore.registry.client import RegistryClient
    from weightstore.registry.reference import parse_reference

    repository = parse_reference(repo).repository
    blobs = {}
    for digest in digests.values():
        ref = parse_reference(f"{repo}@{digest}")
        data, _ = RegistryClient(ref.host).get_manifest(ref)
        for layer in parse_json(data)["layers"]:
            blobs[layer["digest"]] = layer["size"]
    return [(f"http://{host}/v2/{repository}/blobs/{d}", n) for d, n in sorted(blobs.items())]


def _floor(workdir: Path, blobs: list[tuple[str, int]]) -> dict[str, Any]:
    """One run of :data:`FLOOR` in a fresh folder."""
    folder = workdir / "floor"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "blobs").mkdir(parents=True)
    (folder / "urls.txt").write_text("".join(
        f'url = "{url}"\noutput = "{folder}/blobs/{n:04d}"\n'
        for n, (url, _) in enumerate(blobs)))
    proc = harness.run_process(["sh", "-c", FLOOR, "floor", str(folder)], workdir, "floor")
    received = sum(p.stat().st_size for p in (folder / "blobs").iterdir())
    if received != sum(n for _, n in blobs):
        raise harness.BenchError(f"the floor's curl fetched {received} bytes")
    shutil.rmtree(folder)
    return {"seconds": proc.seconds, "cpu": proc.cpu_seconds, "received": received}


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[Target]]:
    r = data["results"]
    med = {m: {k: statistics.median(x[k] for x in r[m]) for k in ("seconds", "cpu",
                                                                  "received")} for m in MODES}
    unique = data["unique_payload_bytes"]
    source_bytes = {m: max(x["source_bytes"] for x in r[m]) for m in ("cache", "cold")}
    floor = ({k: statistics.median(x[k] for x in r["floor"]) for k in ("seconds", "cpu",
                                                                       "received")}
             if r.get("floor") else None)
    summary = {"medians": med, "unique_payload_bytes": unique, "layouts": data["layouts"],
               "source_bytes": source_bytes, "floor": floor}
    targets = [
        Target("cached build / plain pull", med["cache"]["seconds"] / med["pull"]["seconds"],
               1.2),
        Target("  CPU seconds", med["cache"]["cpu"] / med["pull"]["cpu"], None),
        Target("cold build / cached build (>= 5)", med["cold"]["seconds"]
               / med["cache"]["seconds"], None),
        Target("bytes read / unique payload bytes", med["cache"]["received"] / unique, None),
        Target("  the pulls' bytes / unique payload bytes", med["pull"]["received"] / unique,
               None),
        Target("source bytes fetched by a cached build (pinned)", source_bytes["cache"], 0,
               digits=0),
        Target("  by a cold build", source_bytes["cold"], None, digits=0),
    ]
    if floor is not None:
        targets += [Target("cached build / floor (curl, cp, sync)", med["cache"]["seconds"]
                           / floor["seconds"], None),
                    Target("cold build / floor: the most cold / cached can be",
                           med["cold"]["seconds"] / floor["seconds"], None)]
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any], targets: list[Target]) -> str:
    med = summary["medians"]
    lines = [f"build cache: {len(data['layouts'])} layouts ({', '.join(data['layouts'])}), "
             f"{summary['unique_payload_bytes'] / MB:.1f} MB of unique payloads; medians "
             f"of {data['runs']} rounds", "",
             f"{'mode':<8}{'wall s':>9}{'cpu s':>9}{'read MB':>10}"]
    rows = dict(med, **({"floor": summary["floor"]} if summary["floor"] else {}))
    for m, row in rows.items():
        lines.append(f"{m:<8}{row['seconds']:>9.2f}{row['cpu']:>9.2f}"
                     f"{row['received'] / MB:>10.1f}")
    cold = med["cold"]["seconds"] / med["cache"]["seconds"]
    lines += ["", *harness.target_table(targets, "figure", 52, 10),
              f"{'cold / cached >= 5':<52}{cold:>10.2f}  {'PASS' if cold >= 5 else 'MISS'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    harness.add_common_arguments(parser, "the model, checkouts, registry and logs")
    args = parser.parse_args(argv)

    return harness.measure(args, lambda w: run_all(args.runs, w), figures, report)


if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.exit(main())
