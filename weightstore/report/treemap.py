"""The treemap of weight bytes as inline SVG, laid out by squarify (Bruls, Huizing and van
Wijk's squarified treemaps) on the server: the page ships rectangles, not a drawing
library. Coordinates are rounded to a tenth of a pixel, so the same tree gives the same
bytes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ReportError
from .html import esc, human_bytes

WIDTH, HEIGHT = 1200, 640
HEADER = 15  # a group's label strip, where the group is tall and wide enough for one
PAD = 1.5


def squarify_module() -> Any:
    try:
        import squarify
    except ImportError:
        raise ReportError("the HTML report needs squarify: pip install "
                          "'weightstore[report]'") from None
    return squarify


def render_treemap(tree: Mapping[str, Any], tensors: Sequence[Mapping[str, Any]]) -> str:
    """The SVG of ``tree`` (the package view's ``treemap``): one ``<g>`` per group with
    its label, one ``<rect>`` per tensor (``data-i``: its index in ``tensors``) or per
    file's tail of smaller tensors, each with a ``<title>`` tooltip."""
    squarify = squarify_module()
    out: list[str] = []
    models = [c["name"] for c in tree.get("children", [])]
    _layout(squarify, tree, 0.0, 0.0, WIDTH, HEIGHT, 0, None, models, tensors, out)
    return (f'<svg class="treemap" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="treemap of weight bytes">{"".join(out)}</svg>')


def _n(v: float) -> str:
    text = f"{v:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _hue(models: Sequence[str], model: str | None) -> int:
    return 0 if model is None or model not in models else (models.index(model) * 67 + 205) % 360


def _layout(squarify: Any, node: Mapping[str, Any], x: float, y: float, w: float, h: float,
            depth: int, model: str | None, models: Sequence[str],
            tensors: Sequence[Mapping[str, Any]], out: list[str]) -> None:
    kids = [c for c in node.get("children", []) if c["bytes"] > 0]
    if not kids or w < 1 or h < 1:
        return
    sizes = squarify.normalize_sizes([c["bytes"] for c in kids], w, h)
    for child, r in zip(kids, squarify.squarify(sizes, x, y, w, h), strict=True):
        cx, cy, cw, ch = r["x"], r["y"], r["dx"], r["dy"]
        owner = child["name"] if child["kind"] == "model" else model
        if "children" in child:
            _group(squarify, child, cx, cy, cw, ch, depth, owner, models, tensors, out)
        else:
            _leaf(child, cx, cy, cw, ch, _hue(models, owner), tensors, out)


def _group(squarify: Any, node: Mapping[str, Any], x: float, y: float, w: float, h: float,
           depth: int, model: str | None, models: Sequence[str],
           tensors: Sequence[Mapping[str, Any]], out: list[str]) -> None:
    label = node["name"]
    if node["kind"] == "scenario" and node.get("devices"):
        label += f" · {', '.join(node['devices'])}"
    tip = f"{node['kind']} {label}: {human_bytes(node['bytes'])} ({node['bytes']:,} bytes)"
    out.append(f'<g class="{esc(node["kind"])}"><rect x="{_n(x)}" y="{_n(y)}" '
               f'width="{_n(w)}" height="{_n(h)}" fill="hsl({_hue(models, model)},30%,'
               f'{88 - 8 * depth}%)"><title>{esc(tip)}</title></rect>')
    top = 0.0
    if h > 2 * HEADER and w > 48:
        top = HEADER
        chars = max(0, int((w - 6) / 6.5))
        text = f"{label} {human_bytes(node['bytes'])}"
        if len(text) > chars:
            text = text[:max(0, chars - 1)] + "…"
        out.append(f'<text x="{_n(x + 3)}" y="{_n(y + 11)}">{esc(text)}</text>')
    if w > 2 * PAD and h - top > 2 * PAD:
        _layout(squarify, node, x + PAD, y + top + PAD, w - 2 * PAD, h - top - 2 * PAD,
                depth + 1, model, models, tensors, out)
    out.append("</g>")


def _leaf(node: Mapping[str, Any], x: float, y: float, w: float, h: float, hue: int,
          tensors: Sequence[Mapping[str, Any]], out: list[str]) -> None:
    if node["kind"] == "tensor":
        t = tensors[node["tensor"]]
        tip = (f"{t['name']}\n{t['dtype'] or '?'} {t['shape']}  {human_bytes(t['bytes'])} "
               f"({t['bytes']:,} bytes)\n{t['digest']}\nshared by: "
               f"{', '.join(t['shared_by'])}")
        attrs = f' class="t" data-i="{node["tensor"]}"'
        fill = f"hsl({hue},55%,62%)"
    else:
        tip = f"{node['name']}: {human_bytes(node['bytes'])} ({node['bytes']:,} bytes)"
        attrs = ' class="rest"'
        fill = f"hsl({hue},15%,75%)"
    out.append(f'<rect{attrs} x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" '
               f'fill="{fill}"><title>{esc(tip)}</title></rect>')
    if w > 60 and h > 14:
        chars = int((w - 6) / 6.5)
        name = node["name"] if len(node["name"]) <= chars else "…" + node["name"][-(chars - 1):]
        out.append(f'<text class="leaf" x="{_n(x + 3)}" y="{_n(y + 12)}">{esc(name)}</text>')
