"""The package view's data: where the weight bytes go, what deduplication saved, what
each device and scenario needs of the weight files, and the companion files beside them.

Everything comes from the package's ``summary.json`` and from resolution as ``check``
computes it (:func:`weightstore.packaging.check.check_package`: each scenario once, every
model resolved from metadata, no payload read); a device's models run the scenarios its
bundle record names (:func:`weightstore.package.bundle_record.read_bundle`), so its live
ranges are those of its models' variants, and the files it downloads are those its
bundle lists. Nothing here reads a payload.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PackageError

TOP_TENSORS = 300  # tensors named in the treemap; the others are summed per weight file
TOP_SHARED = 50  # shared payloads listed by the bytes their sharing saves
LIVE_MAP_CELLS = 48  # a weight file's live ranges, as the percent live of each 1/48th
PREVIEW_BYTES = 4096  # a text companion's first bytes, shown on the page
DEFAULT = "default"  # the group of a model's weights that no scenario added


def collect(request: Any) -> dict[str, Any] | None:
    """The package view of ``request.folder`` (the target as a package folder), or None
    when the report has no package target (a store alone)."""
    folder = request.folder
    if folder is None:
        return None
    from ..package.summary import read_summary_file

    summary = read_summary_file(folder)[1]
    tensors = _tensors(summary)
    named = _named(tensors)
    view = {
        "package": {k: summary.get(k) for k in ("package", "version", "hash")},
        "layout": summary.get("layout", {}).get("name"),
        "totals": dict(summary.get("totals", {})),
        "files": [{"name": f["name"], "size": f["size"]} for f in summary.get("files", [])],
        "models": _models(summary, tensors),
        "tensors": [{k: v for k, v in t.items() if k != "named"} for t in tensors
                    if t["named"]],
        "treemap": _treemap(summary, tensors, named),
        "shared_payloads": _shared(tensors),
        "variants": _variants(folder, summary),
        "companions": _companions(folder, summary),
    }
    if summary.get("accuracy"):  # a package without keeps its view's bytes
        view["accuracy"] = [dict(a) for a in summary["accuracy"]]
    return view


def _companions(folder: Path, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The package's companion files, then each device's own ones: path, kind, size and
    digest, and a text file's first :data:`PREVIEW_BYTES` (``preview``; None for bytes
    that are not UTF-8 text), every file hashed against the summary as it is read."""
    from ..packaging.companion_files import as_text, companion_files, read_companion

    out = []
    for c in companion_files(summary):
        read = read_companion(folder, c, PREVIEW_BYTES)
        out.append({**c.to_dict(), "preview": as_text(read.head, read.whole),
                    "truncated": not read.whole})
    return out


def _label(model: str, scenario: str | None) -> str:
    return model if scenario is None else f"{model}@{scenario}"


def _tensors(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every external weight, largest first (ties by model, name and scenario), with the
    models and scenarios that share its payload."""
    users: dict[str, set[str]] = defaultdict(set)
    for m in summary["models"]:
        for w in m["external_weights"]:
            users[w["id"]].add(_label(m["name"], w.get("scenario")))
    out = []
    for m in summary["models"]:
        for w in m["external_weights"]:
            out.append({"name": w["name"], "model": m["name"], "scenario": w.get("scenario"),
                        "file": w["location"], "offset": w["offset"], "bytes": w["size"],
                        "dtype": w.get("dtype"), "shape": w.get("shape"),
                        "digest": w["id"], "shared_by": sorted(users[w["id"]])})
    out.sort(key=lambda t: (-t["bytes"], t["model"], t["name"], t["scenario"] or "",
                            t["file"], t["offset"]))
    for i, t in enumerate(out):
        t["named"] = i < TOP_TENSORS
    return out


def _named(tensors: Sequence[dict[str, Any]]) -> dict[int, int]:
    """id() of each named tensor -> its index in the view's ``tensors`` list."""
    return {id(t): i for i, t in enumerate(t for t in tensors if t["named"])}


def _models(summary: Mapping[str, Any], tensors: Sequence[dict[str, Any]]) -> list[dict]:
    """Per model: bytes as it references them, its distinct payloads' bytes, and the part
    of those another model also uses."""
    owners: dict[str, set[str]] = defaultdict(set)
    for t in tensors:
        owners[t["digest"]].add(t["model"])
    out = []
    for m in summary["models"]:
        weights = m["external_weights"]
        unique = {w["id"]: w["size"] for w in weights}
        out.append({"name": m["name"], "file": m["file"], "model_bytes": m.get("model_bytes"),
                    "weights": len(weights),
                    "referenced_bytes": sum(w["size"] for w in weights),
                    "unique_bytes": sum(unique.values()),
                    "shared_bytes": sum(size for key, size in unique.items()
                                        if len(owners[key]) > 1),
                    "scenarios": list(m.get("scenarios", []))})
    return out


def _shared(tensors: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Payloads referenced more than once (by one model or several): what each sharing
    saved, largest saving first."""
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in tensors:
        by_key[t["digest"]].append(t)
    shared = [{"digest": key, "bytes": uses[0]["bytes"], "uses": len(uses),
               "saved_bytes": (len(uses) - 1) * uses[0]["bytes"],
               "names": sorted({t["name"] for t in uses})[:8],
               "shared_by": uses[0]["shared_by"]}
              for key, uses in by_key.items() if len(uses) > 1]
    shared.sort(key=lambda s: (-s["saved_bytes"], s["digest"]))
    return {"count": len(shared), "saved_bytes": sum(s["saved_bytes"] for s in shared),
            "payloads": shared[:TOP_SHARED]}


def _treemap(summary: Mapping[str, Any], tensors: Sequence[dict[str, Any]],
             named: Mapping[int, int]) -> dict[str, Any]:
    """model -> scenario (with the devices that run it) -> weight file -> tensor; the
    tensors not named are one ``rest`` node per weight file, and the files that hold no
    named tensor one ``rest`` node per scenario, so the tree stays small whatever the
    number of tensors and files (a separate layout has a file per weight)."""
    runs: dict[tuple[str, str], list[str]] = defaultdict(list)
    groups: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        m["name"]: {} for m in summary["models"]}
    for t in sorted(tensors, key=lambda t: (t["model"], t["scenario"] or "", t["file"])):
        groups[t["model"]].setdefault(t["scenario"] or DEFAULT, {}).setdefault(
            t["file"], []).append(t)
    for d in summary.get("devices", []):
        for m in summary["models"]:
            scenario = d.get("scenario") if d.get("scenario") in m.get("scenarios", []) \
                else None
            runs[(m["name"], scenario or DEFAULT)].append(d["name"])
    models = []
    for model, scenarios in groups.items():
        children = []
        for scenario, files in scenarios.items():
            file_nodes = [_file_node(name, members, named) for name, members in files.items()
                          if any(t["named"] for t in members)]
            tail = [t for members in files.values() if not any(t["named"] for t in members)
                    for t in members]
            if tail:  # files holding no named tensor (one a weight, say): one cell for all
                count = len({t["file"] for t in tail})
                file_nodes.append({"kind": "rest", "name": f"{len(tail)} smaller tensors in "
                                   f"{count} file(s)", "bytes": sum(t["bytes"] for t in tail),
                                   "count": len(tail), "files": count})
            children.append(_group("scenario", scenario, file_nodes,
                                   devices=sorted(runs.get((model, scenario), []))))
        models.append(_group("model", model, children))
    return _group("package", str(summary.get("package")), models)


def _file_node(name: str, members: Sequence[dict[str, Any]],
               named: Mapping[int, int]) -> dict[str, Any]:
    leaves: list[dict[str, Any]] = [
        {"kind": "tensor", "name": t["name"], "bytes": t["bytes"], "tensor": named[id(t)]}
        for t in members if t["named"]]
    rest = [t for t in members if not t["named"]]
    if rest:
        leaves.append({"kind": "rest", "name": f"{len(rest)} smaller tensors",
                       "bytes": sum(t["bytes"] for t in rest), "count": len(rest)})
    return _group("file", name, leaves)


def _group(kind: str, name: str, children: list[dict[str, Any]], **extra: Any) -> dict:
    children.sort(key=lambda c: (-c["bytes"], c["name"]))
    return {"kind": kind, "name": name, "bytes": sum(c["bytes"] for c in children),
            "children": children, **extra}


def _variants(folder: Path, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The device x file matrix: for each device (as its bundle record chose the scenario
    of each model) and each scenario of the package (the default graph first), the
    weight files its live weights are in, with the live and dead bytes of each.

    A device's live ranges are those its bundle record lists (format 2: what the build's
    resolution found, the record ``bundle`` and the loads of a device folder read); a
    scenario's are those of a device running it, else ``check``'s resolution of it."""
    from ..package.bundle_record import read_bundle

    live: dict[tuple[str, str | None], list[tuple[str, int, int]]] = {}
    problems: dict[str | None, list[str]] = {}
    records = {d["name"]: read_bundle(folder, d["name"], summary)
               for d in summary.get("devices", [])}
    for record in records.values():
        for m in record["models"]:
            if "external_weights" in m:
                live.setdefault((str(m["file"]), m.get("scenario")), [
                    (w["location"], w["offset"], w["size"]) for w in m["external_weights"]])
    scenarios = sorted({s for m in summary["models"] for s in m.get("scenarios", [])})
    by_device = {name: [(str(m["file"]), m.get("scenario")) for m in record["models"]]
                 for name, record in records.items()}
    by_scenario = {s: _choices(summary, s) for s in (None, *scenarios)}
    wanted = {key for chosen in (*by_device.values(), *by_scenario.values())
              for key in chosen}
    for scenario in (None, *scenarios):  # resolve only what no record answers
        if any(key not in live and key[1] == scenario for key in wanted):
            _resolve(folder, scenario, live, problems)
    sizes = {f["name"]: f["size"] for f in summary.get("files", [])}
    from ..package.summary import layout_alignment

    alignment = layout_alignment(summary)
    rows = []
    for d in summary.get("devices", []):
        chosen = by_device[d["name"]]
        rows.append(_row("device", d["name"], d.get("scenario"), chosen, live, sizes,
                         alignment, [p for _, s in chosen for p in problems.get(s, [])],
                         downloads=[str(f["name"]) for f in records[d["name"]]["files"]]))
    for scenario in (None, *scenarios):
        rows.append(_row("scenario", scenario or DEFAULT, scenario, by_scenario[scenario],
                         live, sizes, alignment, problems.get(scenario, [])))
    if summary.get("accuracy"):
        for row in rows:
            row["accuracy"] = _figures_of(summary, row["models"])
    return rows


def _figures_of(summary: Mapping[str, Any],
                chosen: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """The accuracy figures of the scenarios a variant runs (model file -> scenario), as
    the summary records them (the default graph has none: it is what they compare to)."""
    names = {m["file"]: m["name"] for m in summary["models"]}
    runs = {(names.get(file), scenario) for file, scenario in chosen.items()}
    return [dict(a) for a in summary["accuracy"] if (a["model"], a["scenario"]) in runs]


def _choices(summary: Mapping[str, Any], scenario: str | None) -> list[tuple[str, str | None]]:
    """(model file, the scenario it runs) when the package runs ``scenario``: a model
    without it runs its own graph."""
    return [(m["file"], scenario if scenario in m.get("scenarios", []) else None)
            for m in summary["models"]]


def _resolve(folder: Path, scenario: str | None,
             live: dict[tuple[str, str | None], list[tuple[str, int, int]]],
             problems: dict[str | None, list[str]]) -> None:
    """Resolve the package for ``scenario`` as ``check`` does, from metadata."""
    from ..packaging.check import check_package

    report = check_package(folder, scenario=scenario)
    problems[scenario] = list(report.problems)
    for m in report.models:
        entries = report.live[m["file"]]
        live.setdefault((m["file"], m["scenario"]), [
            (e.source.file, e.source.offset, e.source.length) for e in entries
            if e.source.file])  # external weights only (inline ones travel in the model)


def _row(kind: str, name: str, scenario: str | None,
         chosen: Sequence[tuple[str, str | None]],
         live: Mapping[tuple[str, str | None], Sequence[tuple[str, int, int]]],
         sizes: Mapping[str, int], alignment: int, problems: Sequence[str],
         downloads: Sequence[str] | None = None) -> dict[str, Any]:
    """A variant's row: per package weight file its live weights are in (or its bundle
    record lists), the file's size, its live and dead bytes, and ``bundle_size``: the
    bytes of the file of that name its folder (``bundle``, ``pull --device`` /
    ``--scenario``) carries, its live ranges laid out again at the layout's alignment."""
    from ..package.assembly import plan_live

    ranges: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for key in chosen:
        for file, offset, length in live.get(key, ()):
            ranges[file].add((offset, length))
    carried, _ = plan_live(((f, o, n) for f, r in ranges.items() for o, n in r), alignment)
    needed = sorted(set(ranges) | set(downloads or ()))
    files = []
    for name_ in needed:
        if name_ not in sizes:
            raise PackageError("a live weight's file is not in the package summary",
                               file=name_, variant=name)
        merged = _merge(ranges.get(name_, ()))
        live_bytes = sum(length for _, length in merged)
        files.append({"name": name_, "size": sizes[name_], "live_bytes": live_bytes,
                      "dead_bytes": sizes[name_] - live_bytes,
                      "bundle_size": carried.get(name_, 0),
                      "live_ranges": len(ranges.get(name_, ())),
                      "live_map": _live_map(merged, sizes[name_])})
    return {"kind": kind, "name": name, "scenario": scenario,
            "models": dict(chosen),
            "files": files,
            "live_bytes": sum(f["live_bytes"] for f in files),
            "dead_bytes": sum(f["dead_bytes"] for f in files),
            "download_bytes": sum(f["size"] for f in files),
            "bundle_bytes": sum(f["bundle_size"] for f in files),
            "problems": list(problems)}


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges, overlaps and neighbours merged, in offset order."""
    out: list[list[int]] = []
    for offset, length in sorted(ranges):
        if out and offset <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], offset + length - out[-1][0])
        else:
            out.append([offset, length])
    return [(o, n) for o, n in out]


def _live_map(merged: Sequence[tuple[int, int]], size: int) -> list[int]:
    """The percent of each of :data:`LIVE_MAP_CELLS` equal slices of a file that is live."""
    if size <= 0:
        return [0] * LIVE_MAP_CELLS
    cells = [0] * LIVE_MAP_CELLS
    step = size / LIVE_MAP_CELLS
    for offset, length in merged:
        start, end = offset, offset + length
        first, last = int(start // step), min(int((end - 1) // step), LIVE_MAP_CELLS - 1)
        for i in range(first, last + 1):
            lo, hi = max(start, i * step), min(end, (i + 1) * step)
            cells[i] += max(0.0, hi - lo)
    return [min(100, round(100 * c / step)) for c in cells]


def summarize(view: Mapping[str, Any]) -> list[str]:
    """The terminal summary's lines: totals, dedup, top tensors, bytes per device."""
    from .html import accuracy_figure, human_bytes

    t = view["totals"]
    p = view["package"]
    lines = [f"{p['package']} {p['version']} ({view['layout']}): {t.get('models', 0)} "
             f"model(s), {t.get('external_weights', 0)} external weights, "
             f"{human_bytes(t.get('weight_file_bytes', 0))} in {t.get('weight_files', 0)} "
             f"weight file(s)",
             f"dedup: {human_bytes(t.get('referenced_bytes', 0))} referenced, "
             f"{human_bytes(t.get('unique_payload_bytes', 0))} unique, "
             f"{human_bytes(t.get('dedup_saved_bytes', 0))} saved "
             f"({view['shared_payloads']['count']} shared payloads)",
             "top tensors:"]
    for tensor in view["tensors"][:10]:
        where = _label(tensor["model"], tensor["scenario"])
        lines.append(f"  {human_bytes(tensor['bytes']):>10}  {where}: {tensor['name']} "
                     f"{tensor['dtype'] or ''} {tensor['shape'] or ''}".rstrip())
    if view["companions"]:
        lines.append(f"companion files: {len(view['companions'])}, "
                     f"{human_bytes(sum(c['size'] for c in view['companions']))}")
    for entry in view.get("accuracy", []):
        lines.append(f"accuracy of {entry['model']}@{entry['scenario']}: " + ", ".join(
            f"{o['name']} cosine {accuracy_figure(o['cosine'])} "
            f"max_abs {accuracy_figure(o['max_abs'])}"
            for o in entry["outputs"]))
    lines.append("bytes per device and scenario (package files = live + dead; its "
                 "bundle carries live + padding):")
    for row in view["variants"]:
        lines.append(f"  {row['kind']:>8} {row['name']}: live "
                     f"{human_bytes(row['live_bytes'])}, bundle "
                     f"{human_bytes(row['bundle_bytes'])}; package files "
                     f"{human_bytes(row['download_bytes'])}, dead "
                     f"{human_bytes(row['dead_bytes'])} in {len(row['files'])} file(s)")
    return lines
