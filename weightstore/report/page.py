"""The HTML page: one file, everything inline, rendered from the report's data alone.

Each view of :data:`~.views.VIEWS` present in ``data["views"]`` is one
``<section class="view" id="view-NAME">`` with a tab; the fragment ``#NAME`` shows it
(the first view without one), and ``#package&tensor=I`` also the details of the view's
tensor ``I`` (a link to one tensor). The script only switches tabs and shows a clicked
tensor's details from the inline JSON the package view carries; it fetches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .html import esc
from .views import VIEWS

STYLE = """
*{box-sizing:border-box}body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",
sans-serif;color:#1d2330;background:#f6f7f9}header{padding:12px 20px;background:#1d2330;
color:#fff}header h1{margin:0;font-size:18px}header .sub{color:#aab}nav{display:flex;gap:4px;
padding:0 20px;background:#1d2330}nav a{color:#ccd;padding:6px 14px;text-decoration:none;
border-radius:6px 6px 0 0}nav a.on{background:#f6f7f9;color:#1d2330;font-weight:600}
main{padding:4px 20px 40px}.view{display:none}.view.on{display:block}h2 small{font-weight:
normal;color:#667;font-size:13px}.cards{display:flex;flex-wrap:wrap;gap:10px}.card{background:
#fff;border:1px solid #dde;border-radius:8px;padding:10px 14px;min-width:170px}.big{font-size:
22px;font-weight:600}.sub{color:#667;font-size:12px}.tm{display:flex;gap:12px;align-items:
flex-start}.treemap{flex:1 1 auto;min-width:0;width:100%;height:auto;background:#fff;border:
1px solid #dde}.treemap text{font-size:11px;pointer-events:none;fill:#1d2330}.treemap
rect.t{cursor:pointer;stroke:#fff;stroke-width:.5}.treemap rect.t:hover,.treemap rect.sel{
stroke:#000;stroke-width:2}.treemap rect.rest{stroke:#fff;stroke-width:.5}.side{flex:0 0 340px;
max-height:660px;overflow:auto}.details{background:#fff;border:1px solid #dde;border-radius:
8px;padding:8px 10px;margin-bottom:8px;word-break:break-all;min-height:90px}table{border-
collapse:collapse;background:#fff;margin:6px 0 14px}th,td{border:1px solid #e3e5ea;padding:
4px 8px;text-align:left;vertical-align:top}th{background:#eef0f4;font-weight:600}.num{
text-align:right;white-space:nowrap}tr.pick{cursor:pointer}tr.pick:hover,tr.sel{background:#eef3ff}
table.top td{border-width:0 0 1px 0}code{font-size:11px}.bar{display:block;width:120px;
height:10px;fill:#2a6fdb}.bar .bg{fill:#e3e5ea}.matrix td{min-width:90px}.matrix th{
max-width:150px;word-break:break-all;white-space:normal}.scroll{overflow-x:auto;max-width:100%}
"""

SCRIPT = """
(function(){
var views=[].slice.call(document.querySelectorAll('section.view')),pinned=null;
var tensors=[],panel=document.getElementById('details'),data=document.getElementById('tensors');
if(data)tensors=JSON.parse(data.textContent);
function fmt(n){return n.toLocaleString('en')+' bytes';}
function pick(i){var t=tensors[i];if(!t||!panel)return;
[].forEach.call(document.querySelectorAll('.sel'),function(r){r.classList.remove('sel');});
[].forEach.call(document.querySelectorAll('[data-i="'+i+'"]'),function(r){
r.classList.add('sel');});
panel.textContent='';[['tensor',t.name],['model',t.model+(t.scenario?'@'+t.scenario:'')],
['file',t.file+' @ '+t.offset],['dtype',t.dtype||'?'],['shape',JSON.stringify(t.shape)],
['bytes',fmt(t.bytes)],['digest',t.digest],['shared by',t.shared_by.join(', ')]
].forEach(function(kv){var d=document.createElement('div'),b=document.createElement('b');
b.textContent=kv[0]+': ';d.appendChild(b);d.appendChild(document.createTextNode(kv[1]));
panel.appendChild(d);});}
function show(){var parts=location.hash.slice(1).split('&'),name=parts[0],hit=false;
views.forEach(function(v){if(v.id==='view-'+name)hit=true;});
if(!hit&&views.length)name=views[0].id.slice(5);
views.forEach(function(v){v.classList.toggle('on',v.id==='view-'+name);});
[].forEach.call(document.querySelectorAll('nav a'),function(a){
a.classList.toggle('on',a.getAttribute('href')==='#'+name);});
parts.slice(1).forEach(function(p){if(p.indexOf('tensor=')===0){pinned=+p.slice(7);
pick(pinned);}});}
window.addEventListener('hashchange',show);show();
document.addEventListener('click',function(e){var el=e.target.closest('[data-i]');
if(el){pinned=+el.getAttribute('data-i');pick(pinned);}});
document.addEventListener('mouseover',function(e){var el=e.target.closest('rect[data-i]');
if(el)pick(+el.getAttribute('data-i'));else if(pinned!==null&&e.target.closest('svg'))
pick(pinned);});
})();
"""


def _subject(data: Mapping[str, Any]) -> str:
    """What the report is of: the package, version and layout, else the target's name."""
    package = data["views"].get("package")
    if package is None:
        return str(data["target"]["name"])
    p = package["package"]
    return f"{p['package']} {p['version']} ({package['layout']})"


def render_page(data: Mapping[str, Any]) -> str:
    """The whole page for ``data`` (what :func:`~.data.collect_report` returns)."""
    views = data["views"]
    present = [v for v in VIEWS if v.name in views]
    tabs = "".join(f'<a href="#{esc(v.name)}">{esc(v.title)}</a>' for v in present)
    sections = "".join(f'<section class="view" id="view-{esc(v.name)}" data-view="'
                       f'{esc(v.name)}">{v.render(views[v.name], data)}</section>'
                       for v in present)
    target = data["target"]
    title = f"weightstore report: {_subject(data)}"
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<style>{STYLE}</style></head><body><header><h1>{esc(title)}</h1>"
            f'<div class="sub">{esc(target["kind"])} {esc(target["name"])} · '
            f'{esc(data["generator"])} · report '
            f'format {data["format_version"]}</div></header><nav>{tabs}</nav>'
            f"<main>{sections}</main><script>{SCRIPT}</script></body></html>\n")
