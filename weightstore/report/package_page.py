"""The package view's HTML: headline figures, the treemap with its largest tensors, the
deduplication tables and the device x file matrix, from the view's data alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .html import accuracy_figure, count, esc, figure, human_bytes, json_script, table
from .treemap import render_treemap

MATRIX_FILES = 40  # weight-file columns of the matrix; the others share one column
TOP_LISTED = 25  # tensors in the "largest tensors" list beside the treemap
# a file's text as it is (the page's style sheet is the same for every package, so a page
# of a package without companion files is what it was before they existed)
PRE_STYLE = ("margin:4px 0;max-width:760px;max-height:360px;overflow:auto;font-size:11px;"
             "white-space:pre-wrap;word-break:break-all")


def render(view: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    return "".join((_headline(view), _treemap(view), _dedup(view), _matrix(view),
                    _accuracy(view), _companions(view)))


def _accuracy(view: Mapping[str, Any]) -> str:
    """Each scenario's figures on the recipe's samples against the default graph, and
    its bounds (the build refused any it missed)."""
    entries = view.get("accuracy") or []
    if not entries:
        return ""
    rows = []
    for a in entries:
        bounds = ", ".join(f"{k} {v:.6g}" for k, v in sorted(a.get("bounds", {}).items()))
        for o in a["outputs"]:
            rows.append((esc(a["model"]), esc(a["scenario"]), esc(o["name"]),
                         esc(accuracy_figure(o["cosine"])),
                         esc(accuracy_figure(o["max_abs"])),
                         esc(bounds) or '<span class="sub">none</span>'))
    samples = sorted({a["samples"] for a in entries})
    return ("<h3>Accuracy</h3><p class=sub>Each scenario against the default graph on the "
            "recipe's samples, with onnxruntime: every output's cosine similarity and "
            "largest absolute difference (6 significant digits). Samples: "
            + ", ".join(f"<code>{esc(s)}</code>" for s in samples) + "</p>"
            + table(("model", "scenario", "output", "#cosine", "#max_abs", "bounds"), rows,
                    cls="accuracy"))


def _companions(view: Mapping[str, Any]) -> str:
    """The companion files: one row each, a text file's first bytes behind a
    ``<details>`` (escaped: markup in a file is shown, never parsed)."""
    files = view.get("companions") or []
    if not files:
        return ""
    rows = []
    for c in files:
        where = esc(c["path"]) + (f'<div class="sub">device {esc(c["device"])}: '
                                  f'{esc(c["file"])}</div>' if c["device"] else "")
        rows.append((where, esc(c["kind"]),
                     figure(f"companions.{c['device'] or ''}.{c['path']}.size", c["size"]),
                     f'<code>{esc(c["digest"])}</code>', _preview(c)))
    return ("<h3>Companion files</h3><p class=sub>What the package ships beside its models "
            "(configurations, tokenizers, licences), each checked against the summary; "
            "a device's own version of a file is listed under its device.</p>"
            + table(("path", "kind", "#size", "digest", "content"), rows, cls="companions"))


def _preview(c: Mapping[str, Any]) -> str:
    if c["preview"] is None:
        return '<span class="sub">bytes, not text</span>'
    label = (f"first {human_bytes(len(c['preview'].encode()))}" if c["truncated"]
             else "show")
    return (f'<details class="preview"><summary>{esc(label)}</summary>'
            f'<pre style="{PRE_STYLE}">{esc(c["preview"])}</pre></details>')


def _headline(view: Mapping[str, Any]) -> str:
    t = view["totals"]
    p = view["package"]
    cards = [
        ("weight files", figure("totals.weight_file_bytes", t.get("weight_file_bytes", 0)),
         f"{t.get('weight_files', 0)} file(s)"),
        ("referenced by the models", figure("totals.referenced_bytes",
                                            t.get("referenced_bytes", 0)),
         f"{t.get('external_weights', 0):,} external weights"),
        ("unique payloads", figure("totals.unique_payload_bytes",
                                   t.get("unique_payload_bytes", 0)),
         f"{t.get('unique_payloads', 0):,} payloads"),
        ("saved by deduplication", figure("totals.dedup_saved_bytes",
                                          t.get("dedup_saved_bytes", 0)),
         f"{view['shared_payloads']['count']:,} shared payloads"),
        ("model files", figure("totals.model_bytes", t.get("model_bytes", 0)),
         f"{t.get('models', 0)} model(s)"),
    ]
    body = "".join(f'<div class="card"><div class="big">{value}</div><div>{esc(label)}'
                   f'</div><div class="sub">{esc(sub)}</div></div>'
                   for label, value, sub in cards)
    return (f'<h2>{esc(p["package"])} {esc(p["version"])} <small>layout '
            f'{esc(view["layout"])}, {esc(p["hash"])}</small></h2><div class="cards">'
            f"{body}</div>")


def _treemap(view: Mapping[str, Any]) -> str:
    tensors = view["tensors"]
    if not tensors:
        return ('<h3>Where the bytes go</h3><p class="empty">No external weights: every '
                "weight is inside the model files (an embedded layout, or weights under "
                "the layout's size threshold).</p>")
    rows = []
    for i, t in enumerate(tensors[:TOP_LISTED]):
        where = t["model"] + (f"@{t['scenario']}" if t["scenario"] else "")
        rows.append(f'<tr class="pick" data-i="{i}"><td class=num>'
                    f'{figure(f"tensors.{i}.bytes", t["bytes"])}</td><td>{esc(t["name"])}'
                    f'<div class="sub">{esc(where)} · {esc(t["dtype"] or "?")} '
                    f'{esc(t["shape"])}</div></td></tr>')
    shown = len(tensors)
    total = view["totals"].get("external_weights", shown)
    return (f'<h3>Where the bytes go</h3><p class="sub">model → scenario (and the devices '
            f'running it) → weight file → tensor; the {shown:,} largest of '
            f'{total:,} tensors are named, the others summed per file. Hover for details, '
            f'click to keep them.</p><div class="tm">{render_treemap(view["treemap"], tensors)}'
            f'<div class="side"><div id="details" class="details">Click a tensor.</div>'
            f'<table class="top"><tbody>{"".join(rows)}</tbody></table></div></div>'
            f'{json_script("tensors", tensors)}')


def _dedup(view: Mapping[str, Any]) -> str:
    rows = [(esc(m["name"]), count(f"models.{m['name']}.weights", m["weights"]),
             figure(f"models.{m['name']}.referenced_bytes", m["referenced_bytes"]),
             figure(f"models.{m['name']}.unique_bytes", m["unique_bytes"]),
             figure(f"models.{m['name']}.shared_bytes", m["shared_bytes"]))
            for m in view["models"]]
    t = view["totals"]
    rows.append(("<b>package</b>", count("totals.external_weights",
                                         t.get("external_weights", 0)),
                 figure("dedup.referenced_bytes", t.get("referenced_bytes", 0)),
                 figure("dedup.unique_payload_bytes", t.get("unique_payload_bytes", 0)),
                 figure("dedup.dedup_saved_bytes", t.get("dedup_saved_bytes", 0),
                        f"saved {human_bytes(t.get('dedup_saved_bytes', 0))}")))
    shared = view["shared_payloads"]
    payload_rows = [(figure(f"shared.{s['digest']}.saved_bytes", s["saved_bytes"]),
                     f'{human_bytes(s["bytes"])} &times; {s["uses"]}',
                     esc(", ".join(s["names"])), esc(", ".join(s["shared_by"])),
                     f'<code>{esc(s["digest"])}</code>')
                    for s in shared["payloads"]]
    more = shared["count"] - len(shared["payloads"])
    return ("<h3>Deduplication</h3>"
            + table(("model", "#weights", "#referenced", "#unique", "#shared with others"),
                    rows, cls="dedup")
            + f'<h4>Shared payloads ({count("shared.count", shared["count"])}, saving '
              f'{figure("shared.saved_bytes", shared["saved_bytes"])})</h4>'
            + (table(("#saved", "#size x uses", "tensors", "models and scenarios", "digest"),
                     payload_rows, cls="shared") if payload_rows else
               '<p class="sub">No payload is used twice.</p>')
            + (f'<p class="sub">and {more:,} more.</p>' if more > 0 else ""))


def _matrix(view: Mapping[str, Any]) -> str:
    rows = view["variants"]
    if not rows:
        return ""
    needed = {f["name"] for r in rows for f in r["files"]}
    files = [f for f in view["files"] if f["name"] in needed]
    shown = sorted(files, key=lambda f: (-f["size"], f["name"]))[:MATRIX_FILES]
    names = {f["name"] for f in shown}
    columns = [f for f in files if f["name"] in names]
    others = len(files) - len(columns)
    head = ["device / scenario", "#live", "#bundle", "#package files", "#dead"]
    head += [f"#{f['name']}" for f in columns] + ([f"#{others} other files"] if others else [])
    body = []
    for r in rows:
        key = f"variants.{r['kind']}.{r['name']}"
        label = (f'{esc(r["kind"])} <b>{esc(r["name"])}</b><div class="sub">'
                 f'{esc(_runs(r))}</div>{_row_accuracy(r)}')
        cells = [label, figure(f"{key}.live_bytes", r["live_bytes"]),
                 figure(f"{key}.bundle_bytes", r["bundle_bytes"]),
                 figure(f"{key}.download_bytes", r["download_bytes"]),
                 figure(f"{key}.dead_bytes", r["dead_bytes"])]
        by_name = {f["name"]: f for f in r["files"]}
        cells += [_cell(by_name.get(f["name"]), key) for f in columns]
        if others:
            rest = [f for f in r["files"] if f["name"] not in names]
            live = human_bytes(sum(f["live_bytes"] for f in rest))
            cells.append(f"{len(rest)} file(s), {live} live" if rest else "")
        body.append(cells)
    return ("<h3>What each device and scenario needs</h3><p class=sub>From resolution, as "
            "<code>check</code> and <code>bundle</code> compute it: the live bytes a "
            "variant reads, the weight bytes its own folder carries (<code>bundle</code>, "
            "<code>pull --device</code>: only its live payloads, at the layout's "
            "alignment), and the package's weight files its live weights are in, with the "
            "dead bytes a copy of those files would carry. The bar shows where in each "
            "file the live ranges are.</p>"
            + f'<div class="scroll">{table(head, body, cls="matrix")}</div>')


def _row_accuracy(row: Mapping[str, Any]) -> str:
    """A variant's figures under its name: each output of each scenario it runs."""
    lines = [f"{a['model']}@{a['scenario']} {o['name']}: cosine "
             f"{accuracy_figure(o['cosine'])}, max_abs {accuracy_figure(o['max_abs'])}"
             for a in row.get("accuracy", []) for o in a["outputs"]]
    return "".join(f'<div class="sub accuracy">{esc(line)}</div>' for line in lines)


def _runs(row: Mapping[str, Any]) -> str:
    models = row["models"]
    parts = [f"{file}: {scenario or 'default graph'}" for file, scenario in sorted(models.items())]
    if row["problems"]:
        parts.append(f"{len(row['problems'])} problem(s)")
    return "; ".join(parts)


def _cell(f: Mapping[str, Any] | None, key: str) -> str:
    if f is None:
        return ""
    live = figure(f"{key}.files.{f['name']}.live_bytes", f["live_bytes"])
    return (f'{_bar(f["live_map"])}<div>{live} live</div>'
            f'<div class="sub">{human_bytes(f["dead_bytes"])} dead</div>')


def _bar(cells: Sequence[int]) -> str:
    """The live ranges of a file: one strip, darker where more of a slice is live."""
    n = len(cells)
    parts = "".join(f'<rect x="{i}" width="1" height="1" fill-opacity="{v / 100:.2f}"/>'
                    for i, v in enumerate(cells) if v)
    return (f'<svg class="bar" viewBox="0 0 {n} 1" preserveAspectRatio="none">'
            f'<rect width="{n}" height="1" class="bg"/>{parts}</svg>')
