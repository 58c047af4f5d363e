"""A self-contained HTML report of a parity sweep: the build and the counts, a grid of
subjects by path pair coloured by their worst verdict, every subject's NMSE as a small
strip plot, every row that went wrong (or was refused) with its reproducer, and, given
the CI matrix across ggml builds, a grid of ops by build and a defect timeline.

One file that fetches nothing: inline CSS, inline SVG, a few lines of inline JS. Every
grid cell is ``<td class="cell v-VERDICT" data-verdict="VERDICT">``; a pair a subject
never ran is ``<td class="none">``, so ``#grid .cell`` counts (subject, pair) groups."""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable
from html import escape
from typing import Any

from pyggml.parity.files import atomic_write
from pyggml.parity.model import BAD, VERDICTS, Row

__all__ = ["render", "worst_verdict", "write_html"]

# Least to most severe: a cell shows the worst verdict of its rows. A skipped path
# outranks ok (the cell is not fully covered); an unknown verdict ranks as skipped.
_SEVERITY = ("ok", "skipped", "refused", "fail", "error", "timeout", "oob", "crashed")
_COLOUR = {"ok": "#2f9e44", "skipped": "#dee2e6", "refused": "#4c6ef5", "fail": "#f08c00",
           "error": "#e8590c", "timeout": "#c2255c", "oob": "#e03131", "crashed": "#9c1c1c"}

_MONO = "ui-monospace,Menlo,Consolas,monospace"
_CSS = f"""body{{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px 32px;color:#212529}}
h1{{font-size:21px;margin:0 0 10px}}h2{{font-size:16px;margin:30px 0 10px;border-bottom:1px solid #dee2e6}}
dl{{display:grid;grid-template-columns:max-content 1fr;gap:1px 14px;margin:0 0 12px;font-size:13px}}
dt{{color:#868e96}}dd{{margin:0;font-family:{_MONO};overflow-wrap:anywhere}}.note{{color:#868e96;font-size:12px}}
.badge{{display:inline-block;padding:1px 9px;border-radius:10px;margin:0 4px 4px 0;color:#fff;font-size:12px}}
table{{border-collapse:collapse;font-size:12px}}th,td{{padding:2px 7px;border:1px solid #fff}}
thead th{{position:sticky;top:0;background:#f1f3f5}}#timeline td{{border:1px solid #dee2e6;vertical-align:top}}
tbody th{{text-align:left;font-weight:normal;font-family:{_MONO};white-space:nowrap}}.hideok tr.allok{{display:none}}
td.cell{{min-width:48px;text-align:center;color:#fff;cursor:default}}td.none{{background:#f8f9fa}}
.plots{{display:flex;flex-wrap:wrap;gap:8px}}svg text{{font:9px system-ui,sans-serif;fill:#495057}}
figure{{margin:0;padding:4px 6px;border:1px solid #e9ecef;border-radius:4px}}figcaption{{font:12px {_MONO}}}
details{{margin:3px 0;padding:2px 8px;border-left:4px solid #adb5bd;background:#fcfcfd}}.detail{{white-space:pre-wrap}}
.partial{{padding:6px 10px;background:#fff3bf;border-left:4px solid #f08c00;font-weight:600}}
summary{{cursor:pointer;font:12px {_MONO}}}pre{{background:#f1f3f5;padding:8px;overflow:auto;font-size:12px}}
""" + "".join(f".v-{v}{{background:{c}}}details.d-{v}{{border-color:{c}}}" for v, c in _COLOUR.items()) \
    + ".v-skipped{color:#495057!important}"

_JS = """document.querySelectorAll("input[data-hide]").forEach(function (box) { box.addEventListener("change",
  function () { document.getElementById(box.dataset.hide).classList.toggle("hideok", box.checked); }); });"""


def _e(x: Any) -> str:
    return escape(str(x), quote=True)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"    # inf and nan format as themselves


def _cls(verdict: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", verdict)


def worst_verdict(verdicts: Iterable[str]) -> str:
    """The most severe of ``verdicts`` (see ``_SEVERITY``); "ok" for none."""
    return max(verdicts, key=lambda v: _SEVERITY.index(v) if v in _SEVERITY else 1, default="ok")


def _worst_nmse(rows: list[Row]) -> float | None:
    xs = [r.nmse for r in rows if r.nmse is not None]
    return math.nan if any(math.isnan(x) for x in xs) else max(xs, default=None)


def _cell(verdicts: list[str], tip: str, text: str = "") -> str:
    """A grid cell: the worst verdict; its text ``n`` rows, or ``k/n`` when k had the worst."""
    v = worst_verdict(verdicts)
    k, n = verdicts.count(v), len(verdicts)
    text = _e(text) or (str(n) if k == n else f"{k}/{n}")
    return f'<td class="cell v-{_cls(v)}" data-verdict="{_e(v)}" title="{_e(tip)}">{text}</td>'


def _badges(counts: dict[str, int]) -> str:
    order = list(VERDICTS) + sorted(set(counts) - set(VERDICTS))
    return "".join(f'<span class="badge v-{_cls(v)}">{_e(v)} {counts[v]}</span>' for v in order if counts.get(v))


def _table(tid: str, corner: str, cols: list[str], body: list[tuple[str, list[str], bool]], what: str) -> str:
    """A grid: a header of ``cols``, then per (name, cells, all ok) a row, with a box to hide the all-ok ones."""
    head = f"<th>{_e(corner)}</th>" + "".join(f"<th>{_e(c)}</th>" for c in cols)
    trs = "".join(f'<tr{" class=allok" if ok else ""}><th>{_e(n)}</th>{"".join(c)}</tr>' for n, c, ok in body)
    return (f'<p class="note"><label><input type="checkbox" data-hide="{tid}"> hide {what} whose every cell is '
            f'ok</label></p><table id="{tid}"><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>')


def _header(rows: list[Row], meta: dict[str, Any]) -> str:
    ident = dict(meta.get("identity") or {})
    facts = list(ident.items()) + [(k, v) for k, v in meta.items() if k != "identity"]
    dl = []
    for k, v in facts:
        if v is None or v == [] or v == "":
            continue
        if isinstance(v, (list, tuple)):
            v = " ".join(map(str, v))
        elif k == "seconds" and isinstance(v, (int, float)):
            v = f"{v:.1f} s"
        dl.append(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>")
    ref = [r.nmse for r in rows if r.b == "reference" and r.nmse is not None and math.isfinite(r.nmse)]
    n_cases = len({(r.subject, r.type, r.index) for r in rows})
    partial = ""
    if meta.get("partial"):
        partial = (f'<p class="partial" id="partial">Partial report: the sweep did not finish'
                   f'{": " + _e(meta["stopped"]) if meta.get("stopped") else ""}. Everything below is of the cases '
                   f"that finished.</p>")
    return (f"<h1>pyggml parity report: ggml {_e(ident.get('ggml_version', '?'))}</h1>{partial}<dl>{''.join(dl)}</dl>"
            f"<p>{len({r.subject for r in rows})} subjects, {n_cases} cases, {len(rows)} comparisons; worst "
            f"finite NMSE against the reference {_num(max(ref, default=None))}</p>"
            f"<p>{_badges(collections.Counter(r.verdict for r in rows))}</p>")


def _grid(rows: list[Row]) -> str:
    groups: dict[tuple[str, str], list[Row]] = collections.defaultdict(list)
    ops: dict[str, str] = {}
    for r in rows:
        groups[r.subject, f"{r.a}~{r.b}"].append(r)
        ops.setdefault(r.subject, r.op)
    seen = list(dict.fromkeys(p for _, p in groups))
    pairs = sorted(seen, key=lambda p: (not p.endswith("~reference"), seen.index(p)))
    body: list[tuple[str, list[str], bool]] = []
    for s in sorted(ops, key=lambda s: (ops[s], s)):
        cells, allok = [], True
        for p in pairs:
            g = groups.get((s, p))
            if not g:
                cells.append('<td class="none"></td>')
                continue
            vs = [r.verdict for r in g]
            allok &= set(vs) == {"ok"}
            tols = sorted({r.tol for r in g if r.tol is not None})
            tip = (f"{s}  {p}\n{len(g)} rows: " + ", ".join(f"{v} {n}" for v, n in collections.Counter(vs).items())
                   + f"\nworst NMSE {_num(_worst_nmse(g))}" + (f" (tol {_num(tols[-1])})" if tols else ""))
            cells.append(_cell(vs, tip))
        body.append((s, cells, allok))
    return _table("grid", "subject", pairs, body, "subjects")


def _strip(by_pair: dict[str, list[Row]], lo: int, hi: int) -> str:
    """One lane per pair: a dot per row at log10 NMSE (0 at the left gutter, inf at the
    right), short dashed marks at the pair's tolerances."""
    x0, x1, lane = 112, 290, 14
    h = lane * len(by_pair) + 16

    def x(v: float) -> float:
        if v <= 0:
            return x0 - 7
        return x1 + 7 if math.isinf(v) else x0 + (min(max(math.log10(v), lo), hi) - lo) / (hi - lo) * (x1 - x0)

    out = [f'<svg width="300" height="{h}" viewBox="0 0 300 {h}" role="img">',
           f'<line x1="{x0}" y1="{h - 14}" x2="{x1}" y2="{h - 14}" stroke="#adb5bd"/>']
    step = max(1, (hi - lo) // 4)
    for d in range(lo, hi + 1, step):
        xd = x(10.0 ** d)
        out.append(f'<line x1="{xd:.1f}" y1="{h - 16}" x2="{xd:.1f}" y2="{h - 12}" stroke="#adb5bd"/>'
                   f'<text x="{xd:.1f}" y="{h - 3}" text-anchor="middle">1e{d}</text>')
    for i, (p, rs) in enumerate(by_pair.items()):
        y = lane * i + lane / 2 + 1
        out.append(f'<text x="0" y="{y + 3:.1f}">{_e(p)}</text>')
        for t in sorted({r.tol for r in rs if r.tol is not None and r.tol > 0 and math.isfinite(r.tol)}):
            out.append(f'<line x1="{x(t):.1f}" y1="{y - 6:.1f}" x2="{x(t):.1f}" y2="{y + 6:.1f}" stroke="#212529" '
                       f'stroke-dasharray="2 1"><title>tol {_num(t)}</title></line>')
        for r in rs:
            jit = (r.index * 7 + len(r.type)) % 5 - 2    # a little spread, so equal values stay countable
            tip = f"{r.case}: NMSE {_num(r.nmse)} ({r.verdict})"
            out.append(f'<circle cx="{x(r.nmse or 0.0):.1f}" cy="{y + jit:.1f}" r="2.6" fill-opacity="0.75" '
                       f'fill="{_COLOUR.get(r.verdict, "#868e96")}"><title>{_e(tip)}</title></circle>')
    return "".join(out) + "</svg>"


def _plots(rows: list[Row]) -> str:
    subjects: dict[str, dict[str, list[Row]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in sorted(rows, key=lambda r: (r.op, r.subject, r.b != "reference")):
        if r.nmse is not None and not math.isnan(r.nmse):
            subjects[r.subject][f"{r.a}~{r.b}"].append(r)
    logs = [math.log10(v) for r in rows for v in (r.nmse, r.tol) if v is not None and 0 < v < math.inf]
    lo, hi = max(-30, math.floor(min(logs, default=-16))), min(10, math.ceil(max(logs, default=0)))
    lo, hi = min(lo, hi - 4), max(hi, lo + 4)
    figs = [f"<figure><figcaption>{_e(s)}</figcaption>{_strip(by, lo, hi)}</figure>"
            for s, by in subjects.items() if any(r.nmse is not None and math.isfinite(r.nmse)
                                                  for rs in by.values() for r in rs)]
    return ('<p class="note">log10 NMSE of each comparison, one lane per path pair; dashed marks: the tolerance; '
            f'dots at the left edge are exactly 0, at the right edge inf.</p><div class="plots">{"".join(figs)}</div>')


def _issues(rows: list[Row]) -> str:
    bad = [r for r in rows if r.verdict in BAD]
    listed = bad + [r for r in rows if r.verdict == "refused"]
    out = [f'<p class="note">{len(bad)} bad rows, {len(listed) - len(bad)} refused.</p>']
    for i, r in enumerate(listed):
        what = f"{r.subject} [{r.case}] {r.a}~{r.b} NMSE {_num(r.nmse)} tol {_num(r.tol)}"
        opened = " open" if r.verdict in BAD and i < 40 else ""    # the first few bad ones
        out.append(f'<details class="d-{_cls(r.verdict)}" id="row-{i}"{opened}>'
                   f'<summary><span class="badge v-{_cls(r.verdict)}">{_e(r.verdict)}</span>{_e(what)}'
                   + (f" defect {_e(r.defect)}" if r.defect else "") + "</summary>"
                   + (f'<div class="detail">{_e(r.detail)}</div>' if r.detail else "")
                   + (f"<pre>{_e(r.repro)}</pre>" if r.repro else "") + "</details>")
    return "".join(out)


def _matrix(matrix: dict[str, Any]) -> str:
    builds = [str(b) for b in matrix.get("builds", [])]
    cells: dict[str, dict[str, str]] = matrix.get("cells", {})
    body: list[tuple[str, list[str], bool]] = []
    for op in sorted(cells):
        tds = [_cell([str(cells[op][b])], f"{op} on ggml {b}: {cells[op][b]}", str(cells[op][b])) if b in cells[op]
               else '<td class="none"></td>' for b in builds]
        body.append((op, tds, all(v == "ok" for v in cells[op].values())))
    tl = "".join(f'<tr><td>{_e(t.get("id", ""))}</td><td>{_e(t.get("kind", ""))}</td>'
                 f'<td>{_e(t.get("first_seen") or "-")}</td><td>{_e(t.get("last_absent") or "-")}</td>'
                 f'<td>{_e(t.get("absent_again") or "-")}</td>'
                 f'<td>{_e(t.get("detail", ""))}</td></tr>' for t in matrix.get("timeline", []))
    return (f'<h2>Ops across ggml builds</h2>{_table("matrix", "op", builds, body, "ops")}'
            '<h2>Defect timeline</h2><table id="timeline"><thead><tr><th>id</th><th>kind</th><th>first seen</th>'
            f'<th>last absent before</th><th>absent again from</th><th>detail</th></tr></thead><tbody>{tl}</tbody>'
            '</table>')


def render(rows: list[Row], meta: dict[str, Any], matrix: dict[str, Any] | None = None) -> str:
    """The report as one HTML document (a str); ``meta`` as the CLI writes it (``identity``,
    ``quick``, ``seed``, ``seconds``...), ``matrix`` the CI matrix across ggml builds."""
    ident = (meta or {}).get("identity") or {}
    legend = "".join(f'<span class="badge v-{v}">{v}</span>' for v in VERDICTS)
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>pyggml parity: ggml {_e(ident.get('ggml_version', '?'))}</title><style>{_CSS}</style></head><body>"
            f"{_header(rows, meta or {})}<h2>Subjects by path pair</h2>"
            f'<p class="note">Each cell: the worst verdict of that subject\'s comparisons on that pair (the '
            f"number: how many rows, or how many of them had the worst verdict). Hover for counts and NMSE. "
            f"{legend}</p>{_grid(rows)}<h2>NMSE by subject</h2>{_plots(rows)}"
            f"<h2>Rows that went wrong or were refused</h2>{_issues(rows)}"
            f"{_matrix(matrix) if matrix else ''}<script>{_JS}</script></body></html>\n")


def write_html(rows: list[Row], path: str, meta: dict[str, Any] | None = None,
               matrix: dict[str, Any] | None = None) -> None:
    """Write :func:`render` to ``path`` (UTF-8), atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(render(rows, meta or {}, matrix))
