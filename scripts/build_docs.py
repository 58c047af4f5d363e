#!/usr/bin/env python3
"""Build pyggml's documentation site (Sphinx, warnings as errors) from the sources.

The hand-written pages are in ``docs/site/``: the front page (which takes the README's
opening, up to its Documentation section), the guides (``docs/site/guides/``, which the
README links to), Sphinx's configuration. This script copies them to ``<out>/src``, copies
``docs/*.md`` in as the notes, adds the pages it generates, and runs ``sphinx-build -W``
into ``<out>/html``:

* **one page per ggml graph builder** (``ops/<name>.md``), from pyggml's op table
  (``pyggml/ops.txt``: the C signature, what the node is, since which release) and its
  test registry (``pyggml.opinfo``: the float64 reference's source, the types the CPU
  kernel takes, the tolerance and why, whether ggml differentiates it), the defect records
  (``pyggml.defects``: what is known to be wrong with it, in which releases), and a
  runnable example: the smallest contiguous sample of the registry written out as a
  script, run while the page is made, and checked against the float64 reference to the
  op's tolerance (an example that does not pass is not shown, and the build says so);
* the op index, by family;
* the API reference's lists (autodoc fills them from the installed pyggml's docstrings).

``--check`` then checks the built site: every internal link and anchor resolves
(``check_links``), and with Chromium on the PATH (``--chromium``), every page loads in
headless Chromium without a console error or an uncaught exception, and the search page
finds an op (``scripts/check_docs_browser.py``).

    python scripts/build_docs.py [--out build/docs] [--check] [--chromium PATH]

Needs ``pip install -e '.[docs]'`` (Sphinx, furo, myst-parser).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import html.parser
import inspect
import io
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "docs" / "site"
EXAMPLE_MAX_ELEMENTS = 64       # the values of an example's inputs are written out in it
EXAMPLE_FALLBACK_MAX = 256      # ... or up to this many, for an op without a smaller sample
FAMILY_TITLES = {
    "arith": "Arithmetic", "math": "Elementwise math", "activation": "Activations", "glu": "Gated linear units",
    "reduce": "Reductions", "layout": "Layout and views", "norm": "Normalization", "matmul": "Matrix products",
    "attention": "Attention and position", "conv": "Convolution and pooling", "recurrent": "Recurrent and state space",
    "train": "Losses and optimizer steps", "backward": "Backward kernels", "custom": "Custom callbacks",
}


# --- one page per op -----------------------------------------------------------------

def c_signature(row: dict) -> str:
    params = ["struct ggml_context * ctx"]
    for name, ctype, _kind in row["params"]:
        params.append(f"{ctype} {name}")
    return f"struct ggml_tensor * ggml_{row['name']}({', '.join(params)})"


def py_signature(row: dict) -> str:
    return f"pyggml.{row['name']}(ctx, {', '.join(n for n, _, _ in row['params'])})"


def _code(v) -> str:
    """Python source for a non-tensor argument of a sample."""
    import enum

    import pyggml
    if isinstance(v, enum.Enum):
        cls = type(v).__name__
        if getattr(pyggml, cls, None) is not type(v):
            raise ValueError(f"{cls} is not a pyggml name")
        return f"pyggml.{cls}.{v.name}"
    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v)
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, (tuple, list)):
        inner = ", ".join(_code(x) for x in v)
        return f"({inner},)" if isinstance(v, tuple) and len(v) == 1 else (f"({inner})" if isinstance(v, tuple)
                                                                           else f"[{inner}]")
    raise ValueError(f"no source for a {type(v).__name__} argument")


_DTYPES = {"F32": "np.float32", "F16": "np.float16", "I32": "np.int32"}


def _array_code(a) -> str:
    v = np.asarray(a.value)
    if a.type.name == "I32":
        body = np.asarray(v, np.int64).tolist()
    else:
        body = np.round(np.asarray(v, np.float64), 4).tolist()
    return f"np.array({body!r}, dtype={_DTYPES[a.type.name]})"


def _param_values(a):
    """The values a parameter Tensor of a sample was made with (the opt_step ops':
    ``pyggml.opinfo.train.param_tensor``), or None for anything else."""
    from pyggml.opinfo import train
    made = train._PARAMS.get(id(a))
    return made[1] if made is not None and made[0] is a else None


def _rounded(sample):
    """The sample with the values the example writes out (4 decimals)."""
    from pyggml.opinfo import Arg, train

    def one(a):
        if isinstance(a, Arg) and a.type.name != "I32":
            return dataclasses.replace(a, value=np.round(np.asarray(a.value, np.float64), 4))
        values = _param_values(a)
        if values is not None:
            return train.param_tensor(np.round(np.asarray(values, np.float64), 4))
        return a
    return dataclasses.replace(sample, args=tuple(one(a) for a in sample.args))


def _name(name: str) -> str:
    """A C parameter name as a Python variable (mul_mat_id's ``as`` is a keyword)."""
    import keyword
    return name + "_" if keyword.iskeyword(name) else name


def example_code(row: dict, sample) -> str:
    from pyggml.opinfo import Arg
    names = [n for n, _, _ in row["params"]]
    lines = ["import numpy as np", "import pyggml", "", "ctx = pyggml.Context(16 * 1024 * 1024)"]
    call = []
    for name, a in zip(map(_name, names), sample.args):
        if isinstance(a, Arg):
            lines.append(f"{name} = ctx.from_numpy({_array_code(a)})")
            call.append(name)
        elif _param_values(a) is not None:       # a parameter: ggml updates it in place
            body = np.round(np.asarray(_param_values(a), np.float64), 4).tolist()
            lines += [f"{name} = ctx.from_numpy(np.array({body!r}, dtype=np.float32))", f"pyggml.set_param({name})"]
            call.append(name)
        else:
            call.append(_code(a))
    lines += [f"out = pyggml.{row['name']}(ctx, {', '.join(call)})", "graph = pyggml.Graph(ctx)",
              "graph.build_forward_expand(out)", "graph.compute()", "print(out.numpy())"]
    return "\n".join(lines) + "\n"


def _example_candidates(info, max_elements=EXAMPLE_MAX_ELEMENTS):
    from pyggml.opinfo import Arg
    for t in info.types:
        if t.name not in _DTYPES:
            continue
        for s in info.samples(np.random.default_rng(0), t):
            args = [a for a in s.args if isinstance(a, Arg)]
            if s.defect or any(a.layout != "contiguous" or a.type.name not in _DTYPES for a in args):
                continue
            params = [_param_values(a) for a in s.args if not isinstance(a, Arg) and hasattr(a, "ne")]
            if any(p is None for p in params):       # a ready Tensor the example cannot write out
                continue
            size = sum(np.size(a.value) for a in args) + sum(np.size(p) for p in params)
            if size <= max_elements:
                yield t, s


def make_example(row: dict, info) -> tuple[str, str] | None:
    """(code, its output) for the op's first small sample whose example runs and agrees
    with the float64 reference to the op's tolerance (of EXAMPLE_MAX_ELEMENTS values, else
    of EXAMPLE_FALLBACK_MAX); None if none does."""
    import itertools

    from pyggml.opinfo import harness
    for t, sample in itertools.chain(_example_candidates(info),
                                     (c for c in _example_candidates(info, EXAMPLE_FALLBACK_MAX)
                                      if sum(np.size(getattr(a, "value", 0)) for a in c[1].args)
                                      > EXAMPLE_MAX_ELEMENTS)):
        try:
            code = example_code(row, sample)
        except ValueError:
            continue
        scope: dict = {}
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), np.printoptions(precision=4, suppress=True, threshold=60), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)      # the row's flags say it
                exec(compile(code, f"<example {row['name']}>", "exec"), scope)
            got = harness.read(scope["out"])
            ref = harness.reference(info, _rounded(sample))
            if info.canon is not None:
                got, ref = info.canon(got), info.canon(np.asarray(ref).reshape(got.shape))
            _, err, _ = harness._compare(info, got, ref)
        except Exception:           # this sample does not make an example: try the next
            continue
        finally:
            ctx = scope.get("ctx")
            if ctx is not None:
                ctx.close()
        if err <= info.tolerance(t):
            return code, out.getvalue()
    return None


def _source_of(fn) -> str:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return ""
    return src.rstrip() + "\n"


def reference_source(fn, max_helpers: int = 3) -> str:
    """The reference's source, then that of the pyggml functions it calls by name (one
    level: ``_ref_rope_ext`` is one line that calls ``rope_reference``, the computation)."""
    import ast
    src = _source_of(fn)
    if not src:
        return ""
    try:
        tree = ast.parse(src)
    except SyntaxError:         # a lambda's line, cut out of its expression
        return src
    called = dict.fromkeys(n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))
    scope = getattr(fn, "__globals__", {})
    parts = [src]
    for name in called:
        helper = scope.get(name)
        if (inspect.isfunction(helper) and helper is not fn and helper.__module__.startswith("pyggml")
                and len(parts) <= max_helpers):
            more = _source_of(helper)
            if more and more.count("\n") <= 120:
                parts.append(f"# {helper.__module__}.{helper.__name__}\n{more}")
    return "\n\n".join(p.rstrip() for p in parts) + "\n"


def _fmt_types(types) -> str:
    return ", ".join(f"`{t.name}`" for t in types)


def op_page(row: dict, info, defects: list, differentiable, example) -> str:
    name = row["name"]
    out = [f"# {name}", "", f"```{{index}} ggml_{name}, pyggml.{name}", "```", "", row["summary"].rstrip(".") + ".", ""]
    flags = ", ".join(row["flags"]) or "none"
    makes = row["makes"]
    node = (f"`GGML_OP_UNARY` with `GGML_UNARY_OP_{makes[6:]}`" if makes.startswith("UNARY:")
            else f"`GGML_OP_GLU` with `GGML_GLU_OP_{makes[4:]}`" if makes.startswith("GLU:")
            else f"`GGML_OP_{makes}`")
    out += ["| | |", "|---|---|",
            f"| C | `{c_signature(row)}` |",
            f"| Python | `{py_signature(row)}` |",
            f"| the node it returns | {node} |",
            f"| family | [{FAMILY_TITLES.get(row['family'], row['family'])}](index.md#{row['family']}) |",
            f"| in ggml.h since | {row['since']} |",
            f"| flags (op table) | {flags} |",
            f"| bound in this build | {'yes' if row['available'] else 'no: ' + row['reason']} |", ""]
    if info is None:
        out += ["pyggml has no test registry entry (OpInfo) for it: it is not bound.", ""]
        return "\n".join(out)
    out += ["## What it computes", "",
            f"The float64 reference pyggml checks ggml's result against "
            f"(`pyggml/opinfo/{row['family']}.py`, `{getattr(info.ref, '__name__', 'ref')}`):", ""]
    src = reference_source(info.ref)
    out += (["```python", src.rstrip(), "```", ""] if src else ["(its source is not available here)", ""])
    out += ["## Types", "",
            f"The CPU kernel takes {_fmt_types(info.types)} (as pyggml's kernel rule states; every one is "
            f"sampled against the reference, every other float or integer type is refused with "
            f"`GGMLTypeError` before ggml runs: `tests/test_opinfo.py`)."]
    if info.unsampled:
        out += ["", "Taken by the kernel but not sampled:", ""]
        out += [f"* `{t.name}`: {why}" for t, why in info.unsampled.items()]
    out += ["", "## Gradient", ""]
    if differentiable is None:
        out += ["Not known for this build (the node is not made here).", ""]
    elif differentiable:
        checked = (f"pyggml checks it against central differences of the reference (NMSE ≤ {info.grad_tol:g})"
                   if info.grad else "pyggml's registry does not check it against central differences")
        out += [f"ggml's backward pass has a gradient for it (`pyggml.coverage.differentiable('{name}')`); "
                f"{checked}.", ""]
    else:
        out += [f"ggml's backward pass has no gradient for it: `Graph.build_backward_expand` over it raises "
                f"`UnsupportedOpError` naming the node, before ggml would abort.", ""]
    out += ["## Tolerance", "", "| type | NMSE bound against float64 |", "|---|---|"]
    out += [f"| `{t.name}` | {'exact' if info.exact else f'{info.tolerance(t):g}'} |" for t in info.types]
    if info.note:
        out += ["", info.note.rstrip(".") + "."]
    out += ["", "## Known upstream defects", ""]
    if defects:
        out += ["| id | what | seen in | fixed in | what pyggml does |", "|---|---|---|---|---|"]
        for d in defects:
            cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
            out.append(f"| `{d.id}` | {cell(d.title)} | {', '.join(d.seen_in) or '-'} | {d.fixed_in or '-'} | "
                       f"{cell(d.action)} |")
    else:
        out.append("None recorded (`pyggml.defects`).")
    out += ["", "## Example", ""]
    if example is None:
        out += ["No example: none of the registry's samples is small and contiguous enough to write out "
                "(see `tests/test_opinfo.py`'s samples).", ""]
    else:
        code, printed = example
        out += ["```python", code.rstrip(), "```", "", "prints (run when this page was built):", "",
                "```text", printed.rstrip(), "```", ""]
    return "\n".join(out)


def generate_ops(dest: Path) -> dict[str, int]:
    """Write ops/<name>.md and ops/index.md; returns counts."""
    import pyggml
    from pyggml import _optable, coverage, defects
    from pyggml.opinfo import registry
    reg = registry()
    ops_dir = dest / "ops"
    ops_dir.mkdir(parents=True, exist_ok=True)
    by_family: dict[str, list[dict]] = {}
    counts = {"pages": 0, "examples": 0, "no_example": 0}
    no_example = []
    for row in _optable.OPS:
        by_family.setdefault(row["family"], []).append(row)
        info = reg.get(row["name"]) if row["available"] else None
        kinds = {row["makes"].split(":")[0], row["makes"]}
        found = [d for d in defects.DEFECTS if kinds & set(d.ops)]
        diff = None
        if row["available"]:
            try:
                diff = coverage.differentiable(row["name"])
            except pyggml.GGMLError:
                diff = None
        example = make_example(row, info) if info is not None else None
        if info is not None:
            counts["examples" if example else "no_example"] += 1
            if example is None:
                no_example.append(row["name"])
        (ops_dir / f"{row['name']}.md").write_text(op_page(row, info, found, diff, example))
        counts["pages"] += 1
    idx = ["# Op reference", "",
           "One page per graph builder of ggml.h that pyggml's op table lists: its C signature, what it "
           "computes (the float64 reference pyggml tests it against), the types its CPU kernel takes, "
           "whether ggml differentiates it, its tolerance and why, the upstream defects known in it, and a "
           "runnable example. Generated from the op table and the test registry by "
           "`scripts/build_docs.py`; upstream ggml has no per-op documentation.", ""]
    toc = ["```{toctree}", ":hidden:", ":maxdepth: 1", ""]
    for fam, rows in by_family.items():
        idx += [f"({fam})=", f"## {FAMILY_TITLES.get(fam, fam)}", "", "| op | what it computes |", "|---|---|"]
        for r in rows:
            idx.append(f"| [{r['name']}]({r['name']}.md) | {r['summary'].replace('|', chr(92) + '|')} |")
            toc.append(r["name"])
        idx.append("")
    (ops_dir / "index.md").write_text("\n".join(idx + toc + ["```", ""]))
    counts["no_example_ops"] = no_example        # type: ignore[assignment]
    return counts


# --- the front page, from the README; the guides' links; the notes, from docs/ ------------

NOTES = ROOT / "docs"
GUIDES_TO_NOTES = "](../../"        # a guide's link to docs/X.md, as it reads in the repository


def readme_front(text: str) -> str:
    """The front page's text: the README from after its title up to its "Documentation"
    section (which lists what the site's navigation shows), its links to the guides made
    the site's, a ``##`` in a code block left alone."""
    out: list[str] = []
    fence = ""
    for i, line in enumerate(text.splitlines()):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = "" if fence == mark else (fence or mark)
        if not fence and line.startswith("## Documentation"):
            break
        if i == 0 and line.startswith("# "):
            continue
        out.append(line)
    return "\n".join(out).replace("](docs/site/guides/", "](guides/").replace("](docs/", "](notes/").rstrip() + "\n"


def prepare_guides(src: Path) -> int:
    """The front page's README part, the guides' links to the notes, the notes copied in."""
    (src / "_readme_intro.md").write_text(readme_front((ROOT / "README.md").read_text()))
    guides = sorted((src / "guides").glob("*.md"))
    for g in guides:
        g.write_text(g.read_text().replace(GUIDES_TO_NOTES, "](../notes/"))
    ndir = src / "notes"
    ndir.mkdir(exist_ok=True)
    notes = sorted(p.stem for p in NOTES.glob("*.md"))
    for p in sorted(NOTES.glob("*.md")):
        shutil.copy(p, ndir / p.name)
    (ndir / "index.md").write_text("# Notes\n\nThe project's notes (`docs/`): upstream defects ready to file, the "
                                   "backend layer's ownership model, the ULP sweep.\n\n```{toctree}\n:maxdepth: 1"
                                   "\n\n" + "\n".join(notes) + "\n```\n")
    return len(guides) - 1      # (guides/index.md)


# --- the API reference ------------------------------------------------------------------

API_MODULES = ("pyggml.opt", "pyggml.coverage", "pyggml.defects", "pyggml.errors", "pyggml.reference",
               "pyggml.gguf", "pyggml.rpc", "pyggml.attention")


def generate_api(dest: Path) -> int:
    """api/index.md: pyggml's classes and functions other than the op builders (each op
    has its page), then the public modules, through autodoc."""
    import pyggml
    from pyggml import _optable
    ops = {r["name"] for r in _optable.OPS}
    names = [n for n in pyggml.__all__ if n not in ops and not n.startswith("_")]
    classes = sorted(n for n in names if inspect.isclass(getattr(pyggml, n, None)))
    funcs = sorted(n for n in names if callable(getattr(pyggml, n, None)) and n not in classes)
    consts = sorted(n for n in names if n not in classes and n not in funcs)
    adir = dest / "api"
    adir.mkdir(exist_ok=True)
    rst = ["API reference", "=============", "",
           "pyggml's own names (the op builders, ``pyggml.<op>(ctx, ...)``, have a page each in the "
           ":doc:`op reference <../ops/index>`), then its public modules. From the docstrings of the "
           "installed pyggml.", "", "Classes", "-------", ""]
    for n in classes:
        rst += [f".. autoclass:: pyggml.{n}", ""]
    rst += ["Functions", "---------", ""]
    for n in funcs:
        rst += [f".. autofunction:: pyggml.{n}", ""]
    if consts:
        rst += ["Constants", "---------", ""]
        rst += [f"* ``pyggml.{n}`` = ``{getattr(pyggml, n)!r}``" for n in consts] + [""]
    rst += ["Modules", "-------", "", ".. toctree::", "   :maxdepth: 1", ""]
    rst += [f"   {m}" for m in API_MODULES] + [""]
    (adir / "index.rst").write_text("\n".join(rst))
    for m in API_MODULES:
        (adir / f"{m}.rst").write_text(f"{m}\n{'=' * len(m)}\n\n.. automodule:: {m}\n   :no-index:\n")
    return len(classes) + len(funcs)


# --- the site ---------------------------------------------------------------------------

def build(out: Path, jobs: str = "auto") -> dict:
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(SITE, src)
    t0 = time.perf_counter()
    counts = generate_ops(src)
    counts["guides"] = prepare_guides(src)
    counts["api"] = generate_api(src)
    gen_s = time.perf_counter() - t0
    html_dir = out / "html"
    if html_dir.exists():       # no page of an earlier build left to be checked (the doctrees stay: a cache)
        shutil.rmtree(html_dir)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-j", jobs,
           "-d", str(out / "doctrees"), str(src), str(html_dir)]
    # not from the repository root: there `import pyggml` (conf.py, autodoc) would find the
    # source tree's package, without its compiled modules, before the installed one
    proc = subprocess.run(cmd, cwd=out)
    if proc.returncode:
        raise SystemExit(f"build_docs: sphinx-build failed (exit {proc.returncode}): {' '.join(cmd)}")
    return {**counts, "generate_s": gen_s, "sphinx_s": time.perf_counter() - t0, "html": str(html_dir)}


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            v = a.get(key)
            if v and not (tag == "link" and key == "href" and a.get("rel") in (["preconnect"], "preconnect")):
                self.hrefs.append(v)


def check_links(html_dir: Path) -> list[str]:
    """Every relative link and anchor in the built site that resolves to nothing."""
    pages: dict[Path, _Links] = {}
    for p in html_dir.rglob("*.html"):
        parser = _Links()
        parser.feed(p.read_text(errors="replace"))
        pages[p.resolve()] = parser
    broken = []
    for page, parser in pages.items():
        for href in parser.hrefs:
            u = urllib.parse.urlsplit(href)
            if u.scheme or href.startswith(("//", "mailto:", "data:", "javascript:")):
                continue
            target = (page.parent / urllib.parse.unquote(u.path)).resolve() if u.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(html_dir.resolve())}: {href} (no such file)")
                continue
            if u.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if u.fragment not in ids:
                    broken.append(f"{page.relative_to(html_dir.resolve())}: {href} (no such anchor)")
    return broken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "docs"))
    ap.add_argument("--check", action="store_true", help="check links (and, with --chromium, every page in Chromium)")
    ap.add_argument("--chromium", default=None,
                    help="the Chromium to check pages with (default with --check: 'chromium' on the PATH, if any)")
    ap.add_argument("-j", "--jobs", default="auto")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    got = build(out, args.jobs)
    no_ex = got.pop("no_example_ops")
    print(f"build_docs: {got['pages']} op pages ({got['examples']} with a checked example; none for "
          f"{', '.join(no_ex) or 'no op'}), generated in {got['generate_s']:.1f} s; sphinx {got['sphinx_s']:.1f} s; "
          f"open {got['html']}/index.html")
    if not args.check:
        return 0
    html_dir = Path(got["html"])
    broken = check_links(html_dir)
    n_pages = sum(1 for _ in html_dir.rglob("*.html"))
    if broken:
        print(f"build_docs: {len(broken)} broken internal links:\n  " + "\n  ".join(broken[:50]))
        return 1
    print(f"build_docs: every internal link and anchor of {n_pages} pages resolves")
    chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")
    if not chromium:
        print("build_docs: no Chromium on the PATH: the pages were not loaded in a browser")
        return 0
    sys.path.insert(0, str(ROOT / "scripts"))
    import check_docs_browser
    return check_docs_browser.main(["--chromium", chromium, str(html_dir)])


if __name__ == "__main__":
    sys.exit(main())
