"""The diff view (``report TARGET --against OLD``): what changed, and what it costs to ship.

Its figures are ``weightstore diff OLD TARGET``'s
(:func:`weightstore.packaging.diff.diff_packages`, compared from metadata once both sides
are checked as ``diff`` checks them: a folder as ``verify`` does, an archive as ``unpack``
reads it): tensors (external weights, by model, logical name and scenario) added, removed
and changed by digest; the weight bytes each model references before and after; and the
bytes a device holding OLD downloads to hold TARGET, counted three ways: the whole new
package, every file whose digest changed (a file-by-file sync), and what a registry pull
moves (every new payload once, as its own blob, plus the changed files that are not
weight files: weightstore's artifacts carry one blob per payload).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .html import count, esc, figure, table

if TYPE_CHECKING:
    from .request import ReportRequest

LISTED = 300  # changed tensors listed on the page; --json lists every one
SIGNS = {"added": "+", "removed": "-", "changed": "~"}


def collect(request: ReportRequest) -> dict[str, Any] | None:
    if request.against is None:
        return None
    from ..errors import ReportError
    from ..packaging.diff import diff_packages, open_view, weights_by_name

    if request.folder is None:
        raise ReportError("--against compares two packages: give the newer one as TARGET",
                          against=str(request.against))
    old, new = open_view(request.against), open_view(request.folder)
    diff = diff_packages(old, new)
    counts: dict[str, Counter[str]] = {}
    for c in diff.changes:
        counts.setdefault(c.what, Counter())[c.kind] += 1
    weights_old = weights_by_name(old.summary)
    weights_new = weights_by_name(new.summary)
    tensors = [{"kind": c.kind, "name": c.name, "old": c.old, "new": c.new,
                "bytes": (weights_new.get(c.name) or weights_old.get(c.name) or {}).get(
                    "size", 0)}
               for c in diff.changes if c.what == "weight"]
    return {
        "old": request.against.name,
        "identical": diff.identical,
        "counts": {what: {k: counts.get(what, Counter())[k]
                          for k in ("added", "removed", "changed")}
                   for what in ("model", "weight", "scenario", "device", "file")},
        "tensors": tensors,
        "models": _model_bytes(old.summary, new.summary, tensors),
        "changes": [c.to_dict() for c in diff.changes if c.what != "weight"],
        "fetch": {
            "package_bytes": sum(int(c["size"]) for c in new.summary["contents"]),
            "changed_file_bytes": diff.fetch_file_bytes,
            "registry_pull_bytes": diff.fetch_payload_bytes,
            "devices": dict(sorted(diff.device_fetch_bytes.items())),
        },
    }


def _model_bytes(old: Mapping[str, Any], new: Mapping[str, Any],
                 tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model: the external weight bytes it references before and after, and the
    bytes of its tensors that are new or changed."""
    def referenced(summary: Mapping[str, Any]) -> dict[str, int]:
        return {str(m["name"]): sum(int(w["size"]) for w in m["external_weights"])
                for m in summary["models"]}

    before, after = referenced(old), referenced(new)
    changed: Counter[str] = Counter()
    for t in tensors:
        if t["kind"] != "removed":
            changed[t["name"].split("/", 1)[0]] += t["bytes"]
    return [{"model": name, "old_bytes": before.get(name, 0), "new_bytes": after.get(name, 0),
             "changed_bytes": changed[name]}
            for name in sorted(before.keys() | after.keys())]


def render(view: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    c, f = view["counts"], view["fetch"]
    head = (f'<h2>{esc(report["target"]["name"])} <small>against '
            f'{esc(view["old"])}</small></h2>')
    if view["identical"]:
        head += '<p class="empty">The two packages are identical.</p>'
    cards = "".join(
        f'<div class="card"><div class="big">{count(f"counts.weight.{kind}", c["weight"][kind])}'
        f'</div><div>tensors {kind}</div></div>' for kind in ("added", "removed", "changed"))
    fetch_rows = [
        (esc("the whole new package"), figure("fetch.package_bytes", f["package_bytes"])),
        (esc("every file whose digest changed (a whole-file download)"),
         figure("fetch.changed_file_bytes", f["changed_file_bytes"])),
        (esc("a registry pull (new payloads once, changed non-weight files)"),
         figure("fetch.registry_pull_bytes", f["registry_pull_bytes"])),
    ]
    fetch_rows += [(esc(f"device {name}: its changed files"), figure(f"fetch.devices.{name}", n))
                   for name, n in f["devices"].items()]
    models = table(["model", "#before", "#after", "#new or changed"], [
        (esc(m["model"]), figure(f"models.{m['model']}.old_bytes", m["old_bytes"]),
         figure(f"models.{m['model']}.new_bytes", m["new_bytes"]),
         figure(f"models.{m['model']}.changed_bytes", m["changed_bytes"]))
        for m in view["models"]])
    tensors = view["tensors"]
    listed = table(["", "tensor", "#bytes", "digest"], [
        (SIGNS[t["kind"]], esc(t["name"]),
         figure(f"tensors.{i}.bytes", t["bytes"]),
         f'<code>{esc(_short(t["old"]))} → {esc(_short(t["new"]))}</code>')
        for i, t in enumerate(tensors[:LISTED])])
    others = table(["", "what", "name"], [
        (SIGNS[x["kind"]], esc(x["what"]), esc(x["name"])) for x in view["changes"][:LISTED]])
    return (f'{head}<div class="cards">{cards}</div><h3>What an update downloads</h3>'
            f'{table(["to hold the new version", "#bytes"], fetch_rows)}'
            f"<h3>Weight bytes per model</h3>{models}<h3>Tensors</h3>{listed}"
            f"{_more(len(tensors))}<h3>Models, scenarios, devices and files</h3>{others}"
            f"{_more(len(view['changes']))}")


def _more(listed: int) -> str:
    """What the page leaves out of a long list (``--json`` has it all)."""
    if listed <= LISTED:
        return ""
    return f'<p class="sub">and {listed - LISTED:,} more (all in <code>--json</code>)</p>'


def _short(digest: str | None) -> str:
    if digest is None:
        return "∅"
    algo, _, hex_ = digest.partition(":")
    return f"{algo}:{hex_[:12]}…" if hex_ else digest


def summarize(view: Mapping[str, Any]) -> list[str]:
    w, f = view["counts"]["weight"], view["fetch"]
    return [f"against {view['old']}: tensors +{w['added']} -{w['removed']} ~{w['changed']}; "
            f"an update downloads {f['registry_pull_bytes']:,} bytes by registry pull, "
            f"{f['changed_file_bytes']:,} by whole files, of {f['package_bytes']:,}"]
