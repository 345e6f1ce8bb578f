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
from .package_page import PRE_STYLE

if TYPE_CHECKING:
    from ..packaging.diff import Change, PackageView
    from .request import ReportRequest

LISTED = 300  # changed tensors listed on the page; --json lists every one
TEXT_LIMIT = 1 << 20  # companion files up to this size are read to show their change
DIFF_LINES = 400  # a text companion's unified diff is cut at this many lines
DIFF_BYTES = 64 << 10  # or at this many bytes
SIGNS = {"added": "+", "removed": "-", "changed": "~"}


def collect(request: ReportRequest) -> dict[str, Any] | None:
    if request.against is None:
        return None
    from ..errors import ReportError
    from ..packaging.diff import diff_packages, open_view, weights_by_name

    if request.folder is None:
        raise ReportError("--against compares two packages: give the newer one as TARGET",
                          against=str(request.against))
    old, new = (open_view(side, companion_limit=TEXT_LIMIT)
                for side in (request.against, request.folder))
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
                   for what in ("model", "weight", "scenario", "device", "companion",
                                "file")},
        "tensors": tensors,
        "models": _model_bytes(old.summary, new.summary, tensors),
        "changes": [c.to_dict() for c in diff.changes if c.what != "weight"],
        "companions": _companions(old, new, [c for c in diff.changes
                                             if c.what == "companion"]),
        "fetch": {
            "package_bytes": sum(int(c["size"]) for c in new.summary["contents"]),
            "changed_file_bytes": diff.fetch_file_bytes,
            "registry_pull_bytes": diff.fetch_payload_bytes,
            "devices": dict(sorted(diff.device_fetch_bytes.items())),
        },
    }


def _companions(old: PackageView, new: PackageView,
                changes: list[Change]) -> list[dict[str, Any]]:
    """Each companion change with both sides' size, kind and digest, and a text file's
    change as a unified diff (``diff``; None for bytes that are not text, or a file over
    :data:`TEXT_LIMIT`), cut at :data:`DIFF_LINES` lines or :data:`DIFF_BYTES` bytes."""
    from ..packaging.companion_files import companion_files

    files = [{(c.device, c.path): c.file for c in companion_files(v.summary, device_sets=True)}
             for v in (old, new)]
    out = []
    for c in changes:
        sides = [(f.get((c.device, c.name)), v.companion_bytes)
                 for f, v in zip(files, (old, new), strict=True)]
        text, truncated = _unified(c.name, *(None if file is None else held.get(file, False)
                                             for file, held in sides))
        out.append({"kind": c.kind, "path": c.name, "device": c.device,
                    "old_size": c.old_size, "new_size": c.new_size, "old_kind": c.old_kind,
                    "new_kind": c.new_kind, "old_digest": c.old, "new_digest": c.new,
                    "diff": text, "diff_truncated": truncated})
    return out


def _unified(path: str, old: bytes | bool | None,
             new: bytes | bool | None) -> tuple[str | None, bool]:
    """The unified diff of a text file's two sides (None: the side has no such file;
    False: its bytes were not read, being over the limit), cut to the bounds."""
    import difflib

    from ..packaging.companion_files import as_text

    if old is False or new is False:
        return None, False
    texts = [as_text(side, True) if isinstance(side, bytes) else "" for side in (old, new)]
    if texts[0] is None or texts[1] is None:
        return None, False
    names = ("/dev/null" if old is None else f"a/{path}",
             "/dev/null" if new is None else f"b/{path}")
    lines, size = [], 0
    for line in difflib.unified_diff(texts[0].splitlines(keepends=True),
                                     texts[1].splitlines(keepends=True), *names):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        if len(lines) >= DIFF_LINES or size + len(line) > DIFF_BYTES:
            return "".join(lines), True
        lines.append(line)
        size += len(line)
    return "".join(lines), False


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
    rest = [x for x in view["changes"] if x["what"] != "companion"]  # theirs below
    others = table(["", "what", "name"], [
        (SIGNS[x["kind"]], esc(x["what"]), esc(x["name"]) + _values(x))
        for x in rest[:LISTED]])
    return (f'{head}<div class="cards">{cards}</div><h3>What an update downloads</h3>'
            f'{table(["to hold the new version", "#bytes"], fetch_rows)}'
            f"<h3>Weight bytes per model</h3>{models}<h3>Tensors</h3>{listed}"
            f"{_more(len(tensors))}<h3>Models, scenarios, devices and files</h3>{others}"
            f"{_more(len(rest))}{_render_companions(view.get('companions', []))}")


def _render_companions(companions: list[dict[str, Any]]) -> str:
    """Each changed companion by size and digest, and a text file's unified diff."""
    if not companions:
        return ""
    rows, diffs = [], []
    for c in companions:
        key = f"companions.{c['device'] or ''}.{c['path']}"
        name = esc(c["path"]) + (f" <small>device {esc(c['device'])}</small>"
                                 if c["device"] else "")
        sizes = [figure(f"{key}.{side}_size", c[f"{side}_size"])
                 if c[f"{side}_size"] is not None else "" for side in ("old", "new")]
        kinds = " → ".join(dict.fromkeys(k for k in (c["old_kind"], c["new_kind"]) if k))
        rows.append((SIGNS[c["kind"]], name, esc(kinds), *sizes,
                     f'<code>{esc(_short(c["old_digest"]))} → '
                     f'{esc(_short(c["new_digest"]))}</code>'))
        if c["diff"]:
            cut = ('<div class="sub">cut here; the whole file is in the package</div>'
                   if c["diff_truncated"] else "")
            diffs.append(f'<details class="diff" open><summary>{name}</summary>'
                         f'<pre style="{PRE_STYLE}">{_coloured(c["diff"])}</pre>{cut}'
                         "</details>")
    return ("<h3>Companion files</h3>"
            + table(["", "path", "kind", "#before", "#after", "digest"], rows)
            + "".join(diffs))


def _coloured(diff: str) -> str:
    """A unified diff's lines, escaped, removed ones red and added ones green."""
    colours = {"-": "#b42318", "+": "#1a7f37", "@": "#667"}
    out = []
    for line in diff.splitlines(keepends=True):
        colour = None if line.startswith(("---", "+++")) else colours.get(line[:1])
        out.append(f'<span style="color:{colour}">{esc(line)}</span>' if colour
                   else esc(line))
    return "".join(out)


def _more(listed: int) -> str:
    """What the page leaves out of a long list (``--json`` has it all)."""
    if listed <= LISTED:
        return ""
    return f'<p class="sub">and {listed - LISTED:,} more (all in <code>--json</code>)</p>'


def _values(change: Mapping[str, Any]) -> str:
    """An accuracy figure's change, old to new, beside its name."""
    if change["what"] != "accuracy":
        return ""
    old, new = (esc(v) if v is not None else "∅" for v in (change["old"], change["new"]))
    return f' <span class="sub">{old} → {new}</span>'


def _short(digest: str | None) -> str:
    if digest is None:
        return "∅"
    algo, _, hex_ = digest.partition(":")
    return f"{algo}:{hex_[:12]}…" if hex_ else digest


def summarize(view: Mapping[str, Any]) -> list[str]:
    w, f = view["counts"]["weight"], view["fetch"]
    lines = [f"against {view['old']}: tensors +{w['added']} -{w['removed']} ~{w['changed']}; "
             f"an update downloads {f['registry_pull_bytes']:,} bytes by registry pull, "
             f"{f['changed_file_bytes']:,} by whole files, of {f['package_bytes']:,}"]
    c = view["counts"]["companion"]
    if any(c.values()):
        lines.append(f"companion files +{c['added']} -{c['removed']} ~{c['changed']}")
    return lines
