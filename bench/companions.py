"""Companion files (tokenizers, configs, licences) in packages: what they cost in a registry
and in build and pull times.

Figures:

- **registry growth of a companion-only version.** A ``--size-mb`` package (combined
  layout, blake3 store) with about ten companion files of a realistic tokenizer folder
  (``tokenizer.json`` of a 32k-token BPE vocabulary, its configs, ``genai_config.json``, a
  chat template, a licence, a model card; about 2 MB in all) is pushed as 1.0.0 to a fresh
  registry, then 1.0.1, which changes only the model card (``README.md``, a few kB). The
  registry's storage folder grows by the new card, the new summary, config and manifests
  (every payload and every other companion is a blob it already holds). Target: growth
  <= 200 kB; the bytes the push sent are shown beside it.
- **build and pull times with and without companions.** The same package with and
  without its companion files, in ``--runs`` interleaved rounds (the order alternating):
  a cold ``weightstore build`` (an empty store, a fresh output folder) and a
  ``weightstore pull`` into an empty store, each a whole process started once the
  disk has written back what came before (``sync``), after one warm-up round that is
  not counted. Medians; the ratio with / without is the figure, target
  <= 1.10 (the machine is shared, so a few percent either way is noise), and the same
  ratio per byte of the package (the files add about 6% of its bytes, which must cost
  what bytes cost and no more): target <= 1.05. The CPU time of each process (user +
  system), which load distorts less, is shown beside it.

Run as ``python bench/companions.py``; needs the ``docker-registry`` binary (Debian's CNCF
distribution registry).
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

sys.path.insert(0, str(harness.REPO))

from tests.registry_server import BINARY, RegistryServer

RECIPE = """\
package: {package}
version: "{version}"
store: {{path: {store}, hash: blake3}}
{files}models:
  - name: chain
    source: {source}
layouts:
  - {{name: release, external_weight: combined}}
output: {out}
"""
FILES = "files:\n  - {{source: {folder}, path: \".\"}}\n"
CARD = "# Chain\n\nA generated chain model for the companion-file benchmark.\n\n"


def tokenizer_folder(folder: Path, card: str) -> int:
    """A runtime folder's companions, of the sizes a small LLM's have: about 2 MB in ten
    files; the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {f"\u0120tok{i:05d}": i for i in range(32000)}
    merges = [f"\u0120t ok{i:05d}" for i in range(30000)]
    files = {
        "tokenizer.json": json.dumps({"version": "1.0", "added_tokens": [
            {"id": i, "content": t, "special": True} for i, t in enumerate(("<s>", "</s>"))],
            "model": {"type": "BPE", "vocab": vocab, "merges": merges}}, indent=1),
        "tokenizer_config.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                             "model_max_length": 4096,
                                             "chat_template": "{{ messages }}"}, indent=2),
        "special_tokens_map.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>"}),
        "config.json": json.dumps({"architectures": ["ChainForCausalLM"],
                                   "hidden_size": 1024, "vocab_size": 32000}, indent=2),
        "generation_config.json": json.dumps({"max_length": 4096, "do_sample": False}),
        "genai_config.json": json.dumps({"model": {"type": "llama", "context_length": 4096,
                                                   "decoder": {"filename": "chain.onnx"}},
                                         "search": {"max_length": 4096}}, indent=4),
        "chat_template.jinja": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
                               "{% endfor %}\n" * 20,
        "LICENSE": "Apache License\nVersion 2.0, January 2004\n" + "Terms. " * 1500,
        "README.md": card,
        "vocab.txt": "\n".join(vocab) + "\n",
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return sum((folder / name).stat().st_size for name in files)


def build_package(workdir: Path, model_path: Path, version: str, companions: Path | None,
                  tag: str) -> Path:
    """Build the package (in-process) into ``workdir/<tag>``; its folder."""
    from weightstore.builder.run import BuildOptions, build

    recipe = write_recipe(workdir / tag, model_path, version, companions)
    (result,) = build(recipe, BuildOptions(jobs=2)).packages
    return result.path


def write_recipe(folder: Path, model_path: Path, version: str,
                 companions: Path | None) -> Path:
    """The recipe of the package in ``folder`` (its store and output below it)."""
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / f"recipe-{version}.yaml"
    recipe.write_text(RECIPE.format(
        package="chain", version=version, store=folder / "store", source=model_path,
        files=FILES.format(folder=companions) if companions is not None else "",
        out=folder / "out"))
    return recipe


def storage_bytes(server: RegistryServer) -> int:
    """Bytes of every file the registry keeps in its storage folder (blobs, manifests,
    tag and layer links; not its log)."""
    return sum(p.stat().st_size for p in (server.folder / "data").rglob("*") if p.is_file())


def fresh_registry(workdir: Path, name: str) -> RegistryServer:
    folder = workdir / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return RegistryServer(folder).start()


def growth(workdir: Path, model_path: Path) -> dict[str, Any]:
    """Push 1.0.0 and 1.0.1 (only README.md changed) to a fresh registry: how much its
    storage grows, and the bytes sent, for 1.0.1."""
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    v1_files, v2_files = workdir / "hf-1.0.0", workdir / "hf-1.0.1"
    companion_bytes = tokenizer_folder(v1_files, CARD)
    tokenizer_folder(v2_files, CARD + "Evaluated on the chain benchmark: 0.99.\n")
    v1 = build_package(workdir, model_path, "1.0.0", v1_files, "grow")
    v2 = build_package(workdir, model_path, "1.0.1", v2_files, "grow")
    store = WeightStore(workdir / "grow" / "store")
    server = fresh_registry(workdir, "reg-grow")
    try:
        ref = f"{server.host}/bench/chain"
        push(v1, f"{ref}:1.0.0", store=store)
        before = storage_bytes(server)
        report = push(v2, f"{ref}:1.0.1", store=store)
        after = storage_bytes(server)
    finally:
        server.stop()
    package = sum(p.stat().st_size for p in v1.rglob("*") if p.is_file())
    card = (v2 / "README.md").stat().st_size
    return {"package_bytes": package, "companion_bytes": companion_bytes,
            "changed_file_bytes": card, "registry_growth_bytes": after - before,
            "sent_bytes": report.sent_bytes, "uploaded_bytes": report.uploaded_bytes,
            "uploaded_blobs": report.uploaded}


def _weightstore(*argv: str) -> list[str]:
    return [sys.executable, "-m", "weightstore", *argv]


def _settled_run(argv: list[str], workdir: Path, name: str) -> harness.Process:
    """A measured process started with nothing left to write back: the tens of MB the
    previous one wrote (and the folders removed before this one) are not charged to it."""
    os.sync()
    return harness.run_process(argv, workdir, name)


def timings(workdir: Path, model_path: Path, runs: int) -> dict[str, Any]:
    """Cold builds and pulls into an empty store, with and without companions, in
    interleaved rounds."""
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    files = workdir / "hf-1.0.0"
    if not files.exists():
        tokenizer_folder(files, CARD)
    variants = {"without": None, "with": files}
    recipes = {name: write_recipe(workdir / f"time-{name}", model_path, "1.0.0", folder)
               for name, folder in variants.items()}
    times: dict[str, list[float]] = {f"{op} {v}": [] for op in ("build", "pull")
                                     for v in variants}
    cpu: dict[str, list[float]] = {k: [] for k in times}
    server = fresh_registry(workdir, "reg-time")
    try:
        refs = {}
        for i in range(-1, runs):  # round -1 warms the caches (bytecode, page cache)
            harness.log(f"round {i + 1}/{runs}" if i >= 0 else "warm-up round")
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for name in order:
                folder = recipes[name].parent
                shutil.rmtree(folder / "store", ignore_errors=True)
                shutil.rmtree(folder / "out", ignore_errors=True)
                proc = _settled_run(_weightstore("build", str(recipes[name]), "--jobs", "2"),
                                    workdir, f"build-{name}")
                if i >= 0:
                    times[f"build {name}"].append(proc.seconds)
                    cpu[f"build {name}"].append(proc.cpu_seconds)
                if name not in refs:
                    package = next((folder / "out").rglob("summary.json")).parent
                    refs[name] = f"{server.host}/bench/{name}:1"
                    push(package, refs[name], store=WeightStore(folder / "store"))
            for name in order:
                target, store = workdir / f"pulled-{name}", workdir / f"pull-store-{name}"
                shutil.rmtree(target, ignore_errors=True)
                shutil.rmtree(store, ignore_errors=True)
                proc = _settled_run(_weightstore("pull", refs[name], str(target), "--store",
                                                 str(store)), workdir, f"pull-{name}")
                if i >= 0:
                    times[f"pull {name}"].append(proc.seconds)
                    cpu[f"pull {name}"].append(proc.cpu_seconds)
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    size = {name: sum(p.stat().st_size for p in (workdir / f"pulled-{name}").rglob("*")
                      if p.is_file()) for name in variants}
    more = size["with"] / size["without"]  # the bytes the companions add
    return {"seconds": times, "cpu_seconds": cpu, "median": med, "median_cpu": med_cpu,
            "package_bytes": size, "bytes_ratio": more,
            "build_ratio": med["build with"] / med["build without"],
            "pull_ratio": med["pull with"] / med["pull without"],
            "build_cpu_ratio": med_cpu["build with"] / med_cpu["build without"],
            "pull_cpu_ratio": med_cpu["pull with"] / med_cpu["pull without"],
            "build_per_byte_ratio": med["build with"] / med["build without"] / more,
            "pull_per_byte_ratio": med["pull with"] / med["pull without"] / more}


def run(workdir: Path, size_mb: int, runs: int) -> dict[str, Any]:
    import onnx

    from tests.samples import make_large_model

    model_path = workdir / f"chain-{size_mb}.onnx"
    if not model_path.exists():
        harness.log(f"generating a {size_mb} MB model ...")
        onnx.save(make_large_model(size_mb * harness.MB, tensor_bytes=4 << 20),
                  str(model_path))
    harness.log("registry growth of a companion-only version ...")
    grown = growth(workdir, model_path)
    harness.log("build and pull times ...")
    return {"growth": grown, "times": timings(workdir, model_path, runs), "runs": runs}


def figures(data: dict[str, Any]) -> tuple[dict[str, Any], list[harness.Target]]:
    g, t = data["growth"], data["times"]
    targets = [
        harness.Target("registry growth, README-only version (kB)",
                       g["registry_growth_bytes"] / 1000, 200.0, 1),
        harness.Target("bytes sent by that push (kB)", g["sent_bytes"] / 1000, None, 1),
        harness.Target("cold build, with / without companions", t["build_ratio"], 1.10, 3),
        harness.Target("pull, with / without companions", t["pull_ratio"], 1.10, 3),
        harness.Target("cold build CPU, with / without", t["build_cpu_ratio"], None, 3),
        harness.Target("pull CPU, with / without", t["pull_cpu_ratio"], None, 3),
        harness.Target("bytes, with / without", t["bytes_ratio"], None, 3),
        harness.Target("cold build per byte, with / without", t["build_per_byte_ratio"],
                       1.05, 3),
        harness.Target("pull per byte, with / without", t["pull_per_byte_ratio"], 1.05, 3)]
    summary = {"growth": g, "median_seconds": t["median"], "median_cpu_seconds":
               t["median_cpu"], "seconds": t["seconds"], "cpu_seconds": t["cpu_seconds"],
               "runs": data["runs"]}
    return summary, targets


def report(data: dict[str, Any], summary: dict[str, Any],
           targets: list[harness.Target]) -> str:
    g, med = data["growth"], data["times"]["median"]
    lines = [f"package {g['package_bytes'] / harness.MB:.1f} MB, companions "
             f"{g['companion_bytes'] / harness.MB:.2f} MB in 10 files; 1.0.1 changes "
             f"README.md ({g['changed_file_bytes']} B): registry grew "
             f"{g['registry_growth_bytes']} B, push sent {g['sent_bytes']} B "
             f"({g['uploaded_blobs']} blobs, {g['uploaded_bytes']} B of them)",
             *harness.median_lines(data["runs"], med, data["times"]["median_cpu"]), ""]
    lines += harness.target_table(targets, "figure", 46, 10)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5)
    harness.add_common_arguments(parser, "the model, packages, stores and registries")
    args = parser.parse_args(argv)
    if BINARY is None:
        print("bench: error: docker-registry is not installed", file=sys.stderr)
        return 2
    return harness.measure(args, lambda w: run(w, args.size_mb, args.runs), figures, report)


if __name__ == "__main__":
    sys.exit(main())
