"""Benchmark ``weightstore release`` against a release engineer's tar + zstd pipeline.

Usage: ``python bench/release.py [--size-mb 1024] [--runs 3] [--level 3] [--verify]
[--workdir DIR] [--keep] [--json]``

A ``--size-mb`` model (``make_large_model``: float32 tables) is generated once and built
into a combined package (untimed). Then, each in a fresh process, runs interleaved, one
untimed warm-up each (the page cache stays warm for all alike):

* ``release``: ``weightstore release PACKAGE --output DIR --level L`` (zstd workers: one per
  CPU, as ``-T0``): archive, SHA256SUMS, release.json, every package file re-hashed
  against its summary on the way;
* ``tar+zstd``: ``tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - DIR |
  zstd -T0 -L -q -o OUT`` (GNU tar and the zstd CLI, Debian's ``tar`` and ``zstd``
  packages; when either is missing the benchmark says so and skips this variant);
* ``+sha256sum``: the same pipeline followed by ``sha256sum ARCHIVE > SHA256SUMS``, the
  part of what ``release`` writes that a script would also need (for scale);
* ``check``: ``weightstore release --check RECIPE``: rebuild from scratch in a temp folder
  with a fresh store (build + release), compare byte for byte;
* ``unpack``: ``weightstore unpack ARCHIVE DIR`` (every file verified), for scale.

Targets: release / tar+zstd time <= 1.0 (medians), archive size / pipeline size <= 1.0
(the same or a better ratio), release peak RSS <= 200 MB. The machine may be shared: the
figures are medians of ``--runs`` runs, and noise is expected; for scale, the table also
gives the median of the per-round ratios (each round runs the variants back to back, so a
load that changes between rounds cancels out) and the ratio of CPU times (user + system,
from ``wait4``), which the load disturbs least. A measurement, not a gate:
the exit code is 0 whatever the figures (2 when a measured command fails).

``--verify`` measures ``weightstore release --verify`` instead, on signed releases of two
packages built from one ``--size-mb`` model (default 400 MB here): one with companion
files (a small LLM's tokenizer folder, about 2 MB in ten files, as ``bench/companions.py``
makes it), whose subjects ``--verify`` checks inside the archive, and the same package
without them, where ``--verify`` reads no archive member (what it cost before companions
were checked). Beside them, what a user would run instead on the archive with companions:
``sha256sum -c SHA256SUMS`` in the release folder, ``zstd -t`` of the archive, and GNU
tar's ``tar --zstd -tf`` (list) and ``-xf`` (extract into an empty folder). Target:
verify with companions / verify without <= 1.15 (medians; the per-round ratios and the CPU
ratio beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import build as build_bench  # bench/build.py: the model generator and its recipe
import harness
from harness import MB, Process, Target

NAME = 13  # width of the variant column
PIPELINE = ("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - -C {parent}"
            " {name} | zstd -T0 -{level} -q -o {out}")


@dataclass
class Variant:
    name: str
    argv: list[str]
    before: Any = None  # untimed set-up before each run
    runs: list[Process] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    def cpu_median(self) -> float:
        return statistics.median(r.cpu_seconds for r in self.runs)

    def figures(self) -> dict[str, Any]:
        return {"times_s": [r.seconds for r in self.runs], "median_s": self.median(),
                "cpu_s": [r.cpu_seconds for r in self.runs], "median_cpu_s": self.cpu_median(),
                "max_peak_rss_bytes": max(r.peak_rss for r in self.runs)}


def paired(a: Variant, b: Variant) -> float:
    """Median of the per-round ratios a/b: the two ran one after the other in each round,
    so a load that drifts between rounds cancels out of each ratio."""
    return statistics.median(x.seconds / y.seconds for x, y in zip(a.runs, b.runs, strict=True))


def missing_tools() -> list[str]:
    out = [t for t in ("tar", "zstd") if shutil.which(t) is None]
    if "tar" not in out:
        import subprocess

        version = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout
        if "GNU tar" not in version:
            out.append("GNU tar")
    return out


def _rm(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def make_variants(workdir: Path, recipe: Path, level: int) -> tuple[list[Variant], Path]:
    package = workdir / "out" / build_bench.PACKAGE / build_bench.VERSION / build_bench.LAYOUT
    ws = [sys.executable, "-m", "weightstore"]
    if not (package / "summary.json").exists():
        harness.log("building the package (untimed) ...")
        harness.run_process([*ws, "build", str(recipe), "--store", str(workdir / "store")],
                            workdir, "setup-build")
    rel, pipe, unpacked = workdir / "rel", workdir / "pipeline.tar.zst", workdir / "unpacked"
    check_out = workdir / "check-rel"
    if not (check_out / "SHA256SUMS").exists():
        harness.run_process([*ws, "release", str(recipe), "--store", str(workdir / "store"),
                             "--output", str(check_out), "--level", str(level)],
                            workdir, "setup-release")
    archive = rel / (f"{build_bench.PACKAGE}-{build_bench.VERSION}-{build_bench.LAYOUT}"
                     ".tar.zst")
    jobs = str(os.cpu_count() or 1)
    variants = [
        Variant("release", [*ws, "release", str(package), "--output", str(rel), "--level",
                            str(level), "--jobs", jobs], lambda: _rm(rel)),
        Variant("check", [*ws, "release", "--check", str(recipe), "--output", str(check_out),
                          "--level", str(level), "--jobs", jobs]),
        Variant("unpack", [*ws, "unpack", str(archive), str(unpacked)],
                lambda: _rm(unpacked)),
    ]
    missing = missing_tools()
    if missing:
        harness.log(f"skipping tar+zstd: {', '.join(missing)} not found (Debian: apt-get "
                    "install -y tar zstd)")
    else:
        cmd = PIPELINE.format(parent=package.parent, name=package.name, level=level, out=pipe)
        sums = f"{cmd} && (cd {workdir} && sha256sum {pipe.name} > pipeline.SHA256SUMS)"
        variants[1:1] = [
            Variant("tar+zstd", ["bash", "-c", f"set -o pipefail; {cmd}"], lambda: _rm(pipe)),
            Variant("+sha256sum", ["bash", "-c", f"set -o pipefail; {sums}"],
                    lambda: _rm(pipe))]
    return variants, archive


def verify_variants(workdir: Path, size_mb: int, level: int) -> tuple[list[Variant], Path]:
    """The signed releases (built once, untimed) and the commands timed on them; the
    archive with companions."""
    from companions import CARD, tokenizer_folder, write_recipe  # bench/companions.py

    model, _ = build_bench.make_inputs(workdir, size_mb, "chain")
    ws = [sys.executable, "-m", "weightstore"]
    key = workdir / "release.pem"
    if not key.exists():
        harness.run_process([*ws, "key", "generate", str(key)], workdir, "setup-key")
    public = harness.run_process([*ws, "key", "public", str(key)], workdir,
                                 "setup-public").output.strip()
    releases = {}
    for name in ("with", "without"):
        folder = workdir / f"verify-{name}"
        releases[name] = folder / "out" / "releases" / "chain-1.0.0"
        if (releases[name] / "release.intoto.jsonl").exists():
            continue
        files = None
        if name == "with":
            files = folder / "hf"
            tokenizer_folder(files, CARD)
        recipe = write_recipe(folder, model, "1.0.0", files)
        harness.log(f"building and releasing the package {name} companions (untimed) ...")
        harness.run_process([*ws, "release", str(recipe), "--sign", str(key), "--level",
                             str(level)], workdir, f"setup-release-{name}")
    archive = releases["with"] / "chain-1.0.0-release.tar.zst"
    extracted = workdir / "extracted"

    def empty_folder() -> None:
        _rm(extracted)
        extracted.mkdir()

    variants = [Variant("verify", [*ws, "release", "--verify", str(releases["with"]), "--key",
                                   public]),
                Variant("verify-plain", [*ws, "release", "--verify", str(releases["without"]),
                                         "--key", public])]
    missing = missing_tools()
    if missing:
        harness.log(f"skipping GNU tar and zstd: {', '.join(missing)} not found (Debian: "
                    "apt-get install -y tar zstd)")
    else:
        variants += [
            Variant("zstd -t", ["zstd", "-t", "-q", str(archive)]),
            Variant("tar -tf", ["bash", "-c", f"tar --zstd -tf {archive} > /dev/null"]),
            Variant("tar -xf", ["tar", "--zstd", "-xf", str(archive), "-C", str(extracted)],
                    empty_folder)]
    if shutil.which("sha256sum") is not None:
        variants.append(Variant("sha256sum", ["bash", "-c", f"cd {releases['with']} && "
                                              "sha256sum -c --quiet SHA256SUMS"]))
    return variants, archive


def run_rounds(variants: list[Variant], runs: int, workdir: Path) -> None:
    """One untimed warm-up round, then ``runs`` timed ones, the variants in order in each
    (after each one's set-up and a sync, untimed)."""
    for i in range(runs + 1):
        harness.log("warm-up (untimed)" if i == 0 else f"round {i}/{runs}")
        for v in variants:
            if v.before:
                v.before()
            os.sync()
            run = harness.run_process(v.argv, workdir, v.name.replace(" ", ""),
                                      merge_stderr=True)
            if i:
                v.runs.append(run)


def run_verify(size_mb: int, runs: int, level: int, workdir: Path) -> dict[str, Any]:
    variants, archive = verify_variants(workdir, size_mb, level)
    run_rounds(variants, runs, workdir)
    by = {v.name: v for v in variants}
    verify, plain = by["verify"], by["verify-plain"]
    found = [Target("verify / verify without companions", verify.median() / plain.median(),
                    1.15),
             Target("  per-round ratios, median", paired(verify, plain), None),
             Target("  CPU time (user + system)", verify.cpu_median() / plain.cpu_median(),
                    None)]
    found += [Target(f"verify / {v.name}", verify.median() / v.median(), None)
              for v in variants if v.name not in ("verify", "verify-plain")]
    package = archive.parent.parent.parent / "chain" / "1.0.0" / "release"
    raw = sum(p.stat().st_size for p in package.rglob("*") if p.is_file())
    return {"size_mb": size_mb, "level": level, "runs": runs, "cpus": os.cpu_count(),
            "variants": {v.name: v.figures() for v in variants},
            "sizes": {"package_bytes": raw, "archive_bytes": archive.stat().st_size},
            "targets": found, "missing": missing_tools()}


def run_all(size_mb: int, runs: int, level: int, workdir: Path) -> dict[str, Any]:
    _, recipe = build_bench.make_inputs(workdir, size_mb, "chain")
    variants, archive = make_variants(workdir, recipe, level)
    # unpack needs the archive
    run_rounds(sorted(variants, key=lambda v: v.name != "release"), runs, workdir)
    by = {v.name: v for v in variants}
    package = archive.parent.parent / "out"
    raw = sum(p.stat().st_size for p in package.rglob("*") if p.is_file())
    sizes = {"package_bytes": raw, "archive_bytes": archive.stat().st_size}
    found = []
    if "tar+zstd" in by:
        sizes["pipeline_bytes"] = (workdir / "pipeline.tar.zst").stat().st_size
        found += [Target("release / tar+zstd time", by["release"].median()
                         / by["tar+zstd"].median(), 1.0),
                  Target("  per-round ratios, median", paired(by["release"], by["tar+zstd"]),
                         None),
                  Target("  CPU time (user + system)", by["release"].cpu_median()
                         / by["tar+zstd"].cpu_median(), None),
                  Target("release / (tar+zstd, sha256sum)", by["release"].median()
                         / by["+sha256sum"].median(), None),
                  Target("archive / pipeline size", sizes["archive_bytes"]
                         / sizes["pipeline_bytes"], 1.0, 4)]
    found += [Target("release peak RSS MB", by["release"].figures()["max_peak_rss_bytes"] / MB,
                     200.0, 1),
              Target("check / release time", by["check"].median() / by["release"].median(),
                     None),
              Target("unpack / release time", by["unpack"].median() / by["release"].median(),
                     None)]
    return {"size_mb": size_mb, "level": level, "runs": runs, "cpus": os.cpu_count(),
            "variants": {v.name: v.figures() for v in variants}, "sizes": sizes,
            "targets": found, "missing": missing_tools()}


def report(r: dict[str, Any]) -> str:
    s = r["sizes"]
    width = max(len(" ".join(f"{t:.2f}" for t in f["times_s"])) for f in r["variants"].values())
    lines = [f"package {s['package_bytes'] / MB:.1f} MB, zstd level {r['level']}, {r['runs']} "
             f"run(s), {r['cpus']} CPU(s), RSS floor {harness.rss_floor() / MB:.1f} MB",
             f"archive {s['archive_bytes'] / MB:.1f} MB (ratio "
             f"{s['archive_bytes'] / s['package_bytes']:.4f})"
             + (f", pipeline {s['pipeline_bytes'] / MB:.1f} MB (ratio "
                f"{s['pipeline_bytes'] / s['package_bytes']:.4f})" if "pipeline_bytes" in s
                else ""), "",
             f"{'variant':<{NAME}}{'median s':>10}  {'runs s':<{width}}{'CPU s':>8}"
             f"{'peak RSS MB':>13}"]
    for name, f in r["variants"].items():
        times = " ".join(f"{t:.2f}" for t in f["times_s"])
        lines.append(f"{name:<{NAME}}{f['median_s']:>10.3f}  {times:<{width}}"
                     f"{f['median_cpu_s']:>8.2f}{f['max_peak_rss_bytes'] / MB:>13.1f}")
    if r["missing"]:
        lines.append(f"tar+zstd skipped: {', '.join(r['missing'])} not found")
    lines += ["", *harness.target_table(r["targets"], "figure", 36, 9)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=None,
                   help="weights in MB (default 1024; 400 with --verify)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per variant (default 3)")
    p.add_argument("--level", type=int, default=3, help="zstd level for both (default 3)")
    p.add_argument("--verify", action="store_true",
                   help="time release --verify (with and without companion files) against "
                        "sha256sum -c, zstd -t and GNU tar -tf/-xf")
    harness.add_common_arguments(p, "the model, package and archives")
    args = p.parse_args(argv)
    run = run_verify if args.verify else run_all
    size = args.size_mb or (400 if args.verify else 1024)
    result = harness.in_workdir(args.workdir, args.keep,
                                lambda w: run(size, args.runs, args.level, w))
    if result is None:
        return 2
    if args.json:
        print(json.dumps({**result, "targets": [t.as_json() for t in result["targets"]]},
                         indent=2))
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
