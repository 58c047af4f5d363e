"""The documentation site's generated pages and its checks (scripts/build_docs.py,
scripts/check_docs_browser.py). The whole Sphinx build runs in CI's docs stage
(`python scripts/build_docs.py --check`); here: the op pages from the op table and the
registry, the examples checked against float64, and both checks failing on a planted fault."""

import dataclasses
import os
import shutil

import numpy as np
import pytest

import pyggml
from pyggml import _optable
from pyggml.opinfo import registry
from sources import load_script

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

docs = load_script("build_docs", "build_docs_under_test")
ROWS = {r["name"]: r for r in _optable.OPS}


@pytest.fixture(scope="module")
def ops_dir(tmp_path_factory):
    dest = tmp_path_factory.mktemp("site")
    counts = docs.generate_ops(dest)
    return dest / "ops", counts


def test_every_row_of_the_op_table_has_a_page_in_the_index(ops_dir):
    d, counts = ops_dir
    assert counts["pages"] == len(_optable.OPS)
    assert sorted(p.stem for p in d.glob("*.md") if p.stem != "index") == sorted(ROWS)
    index = (d / "index.md").read_text()
    for name in ROWS:
        assert f"]({name}.md)" in index
    # most ops get an example that ran and matched float64 (the rest are named by the build)
    assert counts["examples"] >= 0.9 * sum(r["available"] for r in ROWS.values())


def test_a_page_says_what_the_table_and_the_registry_say(ops_dir):
    d, _ = ops_dir
    page = (d / "mul_mat.md").read_text()
    assert "`struct ggml_tensor * ggml_mul_mat(struct ggml_context * ctx, struct ggml_tensor * a, " \
           "struct ggml_tensor * b)`" in page
    assert "`GGML_OP_MUL_MAT`" in page and "| in ggml.h since | " + ROWS["mul_mat"]["since"] in page
    info = registry()["mul_mat"]
    assert all(f"`{t.name}`" in page for t in info.types)
    assert "has a gradient for it" in page
    tanh = (d / "tanh.md").read_text()
    assert "`GGML_UNARY_OP_TANH`" in tanh and "has no gradient for it" in tanh
    assert pyggml.coverage.differentiable("mul_mat") and not pyggml.coverage.differentiable("tanh")
    # a defect record appears on its op's page, with its releases
    rope = next(dd for dd in pyggml.defects.DEFECTS if "ROPE" in dd.ops)
    text = (d / "rope_ext.md").read_text()
    # the reference, and the helper that computes it (_ref_rope_ext only passes its arguments on)
    assert "def _ref_rope_ext(" in text and "def rope_reference(" in text
    assert f"`{rope.id}`" in text and (", ".join(rope.seen_in) or "-") in text
    assert "map_custom1" in ROWS and "bound in this build | no: " in (d / "map_custom1.md").read_text()


def test_an_example_is_the_code_that_ran_and_it_printed_what_the_page_shows(ops_dir, capsys):
    d, _ = ops_dir
    page = (d / "add.md").read_text()
    code = page.split("```python\n")[-1].split("```")[0]
    printed = page.split("```text\n")[-1].split("```")[0]
    scope = {}
    with np.printoptions(precision=4, suppress=True, threshold=60):
        exec(code, scope)
    assert capsys.readouterr().out.strip() == printed.strip()
    a, b = (scope[n].numpy().astype(np.float64) for n in ("a", "b"))
    assert np.allclose(scope["out"].numpy(), a + b)
    scope["ctx"].close()


def test_examples_of_a_parameter_updated_in_place_and_of_a_keyword_parameter(ops_dir, capsys):
    """opt_step_sgd's example flags its parameter (ggml updates it in place), and
    mul_mat_id's names its ``as`` (a Python keyword) ``as_``: both run, and print what
    the page shows, the values of the reference."""
    d, _ = ops_dir
    for name in ("opt_step_sgd", "mul_mat_id"):
        page = (d / f"{name}.md").read_text()
        code = page.split("```python\n")[-1].split("```")[0]
        printed = page.split("```text\n")[-1].split("```")[0]
        scope = {}
        with np.printoptions(precision=4, suppress=True, threshold=60):
            exec(code, scope)
        assert capsys.readouterr().out.strip() == printed.strip(), name
        if name == "opt_step_sgd":
            assert "pyggml.set_param(a)" in code
            w = np.asarray(eval(code.split("a = ctx.from_numpy(")[1].split(")\n")[0], {"np": np}), np.float64)
            g = scope["grad"].numpy().astype(np.float64)
            alpha, wd = scope["sgd_params"].numpy().astype(np.float64)
            assert np.allclose(scope["out"].numpy(), w * (1 - alpha * wd) - alpha * g, atol=1e-6)
        else:
            assert "as_ = ctx.from_numpy(" in code and "pyggml.mul_mat_id(ctx, as_," in code
        scope["ctx"].close()


def test_an_example_that_disagrees_with_the_reference_is_not_shown():
    info = registry()["add"]
    row = ROWS["add"]
    assert docs.make_example(row, info) is not None
    wrong = dataclasses.replace(info, ref=lambda a, b: a - b)
    assert docs.make_example(row, wrong) is None


def test_the_front_page_is_the_readme_up_to_its_documentation_section():
    text = "# T\nintro [g](docs/site/guides/x.md) [n](docs/n.md)\n```sh\n## Documentation in code\n```\n" \
           "## Use\nu\n## Documentation\nlist\n## Limits\nl\n"
    front = docs.readme_front(text)
    assert front.startswith("intro [g](guides/x.md) [n](notes/n.md)")
    assert "## Documentation in code" in front and "## Use\nu" in front
    assert "list" not in front and "Limits" not in front


def test_sphinx_runs_outside_the_source_tree(tmp_path, monkeypatch):
    # from the repository root, conf.py's `import pyggml` finds the source tree's package
    # (no compiled modules) before an installed one: CI's non-editable install failed so
    calls = []

    class Done:
        returncode = 0
    monkeypatch.setattr(docs.subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw)) or Done())
    got = docs.build(tmp_path / "out")
    ((cmd, kw),) = calls
    assert cmd[1:3] == ["-m", "sphinx"] and "-W" in cmd
    assert kw["cwd"] == tmp_path / "out" and docs.ROOT not in (tmp_path / "out").parents
    assert (tmp_path / "out" / "src" / "ops" / "mul_mat.md").exists() and got["guides"] >= 10


def _site(tmp_path, body):
    (tmp_path / "sub").mkdir(parents=True)
    (tmp_path / "index.html").write_text(f"<html><body><h1 id='top'>x</h1>{body}</body></html>")
    (tmp_path / "sub" / "page.html").write_text("<html><body><p id='here'>y</p><a href='../index.html#top'>up</a>"
                                                "</body></html>")
    return tmp_path


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    ok = _site(tmp_path / "ok", "<a href='sub/page.html#here'>a</a><a href='https://example.org/x'>b</a>")
    assert docs.check_links(ok) == []
    bad = _site(tmp_path / "bad", "<a href='sub/gone.html'>a</a><a href='sub/page.html#nowhere'>b</a>"
                                  "<script src='_static/missing.js'></script>")
    found = docs.check_links(bad)
    assert len(found) == 3
    assert any("sub/gone.html (no such file)" in f for f in found)
    assert any("#nowhere (no such anchor)" in f for f in found)
    assert any("_static/missing.js" in f for f in found)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_browser_check_reports_console_errors_and_exceptions(tmp_path):
    if CHROMIUM is None:
        # .ci/run installs Chromium and sets PYGGML_REQUIRE_BROWSER: there, a missing one fails
        (pytest.fail if os.environ.get("PYGGML_REQUIRE_BROWSER") else pytest.skip)("no Chromium on the PATH")
    browser_check = load_script("check_docs_browser", "check_docs_browser_under_test")
    (tmp_path / "fine.html").write_text("<html><body><p>fine</p><script>console.log('hello')</script></body></html>")
    (tmp_path / "throws.html").write_text("<html><body><script>undefinedFunction()</script></body></html>")
    (tmp_path / "logs.html").write_text("<html><body><script>console.error('planted')</script></body></html>")
    (tmp_path / "missing.html").write_text("<html><head><script src='nope.js'></script></head><body></body></html>")
    pages = sorted(tmp_path.glob("*.html"))
    browser = browser_check.Chromium(CHROMIUM, 30.0)
    try:
        bad = browser_check.check_pages(browser, tmp_path, pages)
    finally:
        browser.close()
    assert sorted(bad) == ["logs.html", "missing.html", "throws.html"]
    assert "undefinedFunction" in " ".join(bad["throws.html"])
    assert "planted" in " ".join(bad["logs.html"])
    assert "nope.js" in " ".join(bad["missing.html"])
