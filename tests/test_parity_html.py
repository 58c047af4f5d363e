"""The HTML report of a parity sweep: one grid cell per (subject, path pair) coloured by
its worst verdict, everything escaped, nothing fetched; and, where a headless Chromium
and a driver for it are installed, that the page loads without a script error."""

import math
import os
import re
import shutil
from html.parser import HTMLParser

import pytest

from pyggml.parity import html as phtml
from pyggml.parity.model import Row

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

EVIL = "<script>alert('x')</script> & \"quoted\""
REPRO = "import pyggml\nx = soft_max(a) if n < 3 & m > 2 else None  # " + EVIL + "\n"


def row(subject, a, b, verdict, nmse=0.0, index=0, **kw):
    return Row(subject=subject, op=subject.split(":")[-1], case=f"F32 (4,) #{index}", type="F32",
               index=index, seed=0, a=a, b=b, nmse=nmse, max_abs=None if nmse is None else 0.0,
               tol=1e-7, verdict=verdict, **kw)


ROWS = [
    row("op:add", "ggml", "reference", "ok", 1e-15),
    row("op:add", "ggml", "reference", "ok", 0.0, index=1),
    row("op:add", "ggml", "ggml-ref", "ok", 3e-16),
    row("op:soft_max", "ggml", "reference", "ok", 2e-9),
    row("op:soft_max", "ggml", "reference", "fail", 0.5, index=1, detail="NMSE 5e-01 > 1e-07 " + EVIL,
        repro=REPRO),
    row("op:soft_max", "ggml", "ggml-ref", "refused", None, detail="known defect " + EVIL, defect="sm-mask<oob>"),
    row("op:soft_max", "ggml-ref", "reference", "ok", math.inf, index=2),   # inf must not break a plot
    row("op:rope", "ggml", "reference", "crashed", None, detail="worker died: SIGSEGV"),
    row("op:rope", "ggml", "reference", "error", math.nan, index=1, detail="ValueError"),
    row("grad:rope", "autodiff", "reference", "skipped", None),
    row("op:<b>", "ggml", "reference", "oob", math.nan, detail="read past tensor " + EVIL),
]
# (subject, pair) -> worst verdict the grid must show
EXPECTED = {("op:add", "ggml~reference"): "ok", ("op:add", "ggml~ggml-ref"): "ok",
            ("op:soft_max", "ggml~reference"): "fail", ("op:soft_max", "ggml~ggml-ref"): "refused",
            ("op:soft_max", "ggml-ref~reference"): "ok", ("op:rope", "ggml~reference"): "crashed",
            ("grad:rope", "autodiff~reference"): "skipped", ("op:<b>", "ggml~reference"): "oob"}
META = {"identity": {"ggml_version": "0.9.4", "ggml_source": "pypi:<src>", "cpu_features": ["avx2", "fma"]},
        "quick": True, "seed": 0, "seconds": 1.25}
MATRIX = {"builds": ["0.9.3", "0.9.4", "main"],
          "cells": {"soft_max": {"0.9.3": "ok", "0.9.4": "fail", "main": "ok"}, "rope": {"0.9.4": "refused"}},
          "timeline": [{"id": "sm-mask-oob", "kind": "defect", "first_seen": "0.9.4", "last_absent": "0.9.3",
                        "detail": EVIL},
                       {"id": "rope-neox", "kind": "disagreement", "first_seen": None, "last_absent": None,
                        "detail": ""}]}


class Page(HTMLParser):
    """Cells per table id, the text of every <pre>, every src/href, and the script count."""

    def __init__(self, text):
        super().__init__()
        self.tables, self.cells, self.pres, self.links, self.scripts = [], {}, [], [], 0
        self.tr, self.in_pre = None, False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "table":
            self.tables.append(a.get("id"))
        elif tag == "script":
            self.scripts += 1
        elif tag == "pre":
            self.in_pre = True
            self.pres.append("")
        elif tag == "tr":
            self.tr = []
        elif tag == "td" and "cell" in (a.get("class") or "").split():
            self.cells.setdefault(self.tables[-1], []).append(a)

    def handle_endtag(self, tag):
        if tag == "table":
            self.tables.pop()
        elif tag == "pre":
            self.in_pre = False

    def handle_data(self, data):
        if self.in_pre:
            self.pres[-1] += data


@pytest.fixture(scope="module")
def page():
    return phtml.render(ROWS, META, MATRIX)


def test_grid_has_one_cell_per_subject_and_pair_with_its_worst_verdict(page):
    cells = Page(page).cells["grid"]
    assert len(cells) == len(EXPECTED)
    assert sorted(c["data-verdict"] for c in cells) == sorted(EXPECTED.values())
    for c in cells:
        assert c["class"] == f"cell v-{c['data-verdict']}"
    fail = next(c for c in cells if c["data-verdict"] == "fail")
    assert "op:soft_max" in fail["title"] and "fail 1" in fail["title"] and "5.00e-01" in fail["title"]
    assert "worst NMSE nan" in next(c for c in cells if c["data-verdict"] == "crashed")["title"]


def test_matrix_and_timeline(page):
    p = Page(page)
    assert sorted(c["data-verdict"] for c in p.cells["matrix"]) == ["fail", "ok", "ok", "refused"]
    assert page.count('id="timeline"') == 1 and "sm-mask-oob" in page and "0.9.3" in page
    assert 'id="matrix"' not in phtml.render(ROWS, META) and 'id="timeline"' not in phtml.render(ROWS, META)


def test_everything_is_escaped(page):
    p = Page(page)
    assert p.scripts == 1                     # only the report's own
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert p.pres == [REPRO]                  # the reproducer, exactly, once unescaped
    assert "&lt;b&gt;" in page and "pypi:&lt;src&gt;" in page and "sm-mask&lt;oob&gt;" in page


def test_bad_and_refused_rows_are_listed():
    page = phtml.render(ROWS, {})
    for r in ROWS:
        listed = r.verdict in ("fail", "refused", "oob", "crashed", "error")
        assert (f"{r.subject} [{r.case}] {r.a}~{r.b}" in page.replace("&lt;", "<").replace("&gt;", ">")) == listed
    assert page.count("<details") == 5
    assert phtml.render([ROWS[0]], {}).count("<details") == 0


def test_nothing_external(page):
    links = Page(page).links
    assert not [u for u in links if not u.startswith("#")]
    assert not re.search(r"https?:|//[a-z]|@import|url\(", page, re.IGNORECASE)


def test_plots_skip_subjects_without_a_finite_nmse(page):
    figs = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    assert figs == ["op:add", "op:soft_max"]  # rope/grad:rope/<b>: only None, nan
    assert page.count("<svg") == 2 and page.count("<circle") == 6
    assert phtml.render([], {}).count("<td") == 0


def test_worst_verdict():
    assert phtml.worst_verdict(["ok", "refused", "fail", "ok"]) == "fail"
    assert phtml.worst_verdict(["ok", "skipped"]) == "skipped"
    assert phtml.worst_verdict(["timeout", "crashed", "oob"]) == "crashed"
    assert phtml.worst_verdict([]) == "ok"


def test_write_html(tmp_path):
    f = tmp_path / "r.html"
    phtml.write_html(ROWS, str(f))
    assert f.read_text(encoding="utf-8") == phtml.render(ROWS, {})


def _chromium():
    # .ci/run installs the browser and sets PYGGML_REQUIRE_BROWSER: there, a missing one fails
    skip = pytest.fail if os.environ.get("PYGGML_REQUIRE_BROWSER") else pytest.skip
    exe = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if exe is None:
        skip("no Chromium binary (chromium, chromium-browser or google-chrome) on PATH")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip("playwright is not installed (pip install playwright; the system Chromium is used)")
    return exe, sync_playwright


@pytest.mark.parametrize("matrix", [None, MATRIX])
def test_page_loads_in_headless_chromium(tmp_path, matrix):
    exe, sync_playwright = _chromium()
    f = tmp_path / "report.html"
    phtml.write_html(ROWS, str(f), META, matrix)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True)
        try:
            pg = browser.new_page()
            console, errors = [], []
            pg.on("console", lambda m: console.append((m.type, m.text)))
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.on("request", lambda r: errors.append("request " + r.url) if not r.url.startswith("file:") else None)
            pg.goto(f.as_uri())
            pg.wait_for_load_state("load")
            assert pg.locator("#grid .cell").count() == len(EXPECTED)
            assert pg.locator("#matrix .cell").count() == (4 if matrix else 0)
            assert pg.locator("#grid .cell.v-fail").evaluate("e => getComputedStyle(e).backgroundColor") \
                != pg.locator("#grid .cell.v-ok").first.evaluate("e => getComputedStyle(e).backgroundColor")
            # the filter (the page's only script) hides the subject whose every cell is ok
            rows = pg.locator("#grid tbody tr:visible")
            assert rows.count() == 5
            pg.locator('input[data-hide="grid"]').check()
            assert rows.count() == 4
        finally:
            browser.close()
    assert not errors, errors
    assert not [m for m in console if m[0] in ("error", "warning")], console
