"""The README's and the guides' Python examples run as written, and compute what they
claim: each ```python block is executed in a fresh namespace (fragments are fenced ```py); the Llama-style block is compared
with a float64 NumPy transformer and the training loop with NumPy's AdamW."""

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the README and the guides it links to (docs/site/guides/, the documentation site's pages)
DOCS = [README] + sorted((ROOT / "docs" / "site" / "guides").glob("*.md")) if README.exists() else []
BLOCKS = [(f"{p.relative_to(ROOT)} block {i}", code) for p in DOCS
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(), re.S))]
pytestmark = pytest.mark.skipif(not BLOCKS, reason="needs the source tree's README.md and guides")


def _run(marker):
    ((where, code),) = [(w, b) for w, b in BLOCKS if marker in b]
    ns = {"__name__": "readme"}
    exec(compile(code, f"{where}[{marker}]", "exec"), ns)
    return ns


def test_every_python_block_runs(capsys):
    import pyggml
    ran = set()
    for where, code in BLOCKS:
        if "pyggml.rpc.RPCServer()" in code and pyggml.rpc_protocol() is None:
            continue        # a build without ggml's RPC backend (a prebuilt ggml): its own test says so
        exec(compile(code, where, "exec"), {"__name__": "readme"})
        ran.add(where.split(" block ")[0])
    assert len([w for w, _ in BLOCKS]) >= 10 and "README.md" in ran and len(ran) >= 4


def test_the_readme_links_every_guide_and_the_guides_index_lists_them():
    guides = {p.stem for p in (ROOT / "docs" / "site" / "guides").glob("*.md")} - {"index"}
    text = README.read_text()
    assert {g for g in guides if f"](docs/site/guides/{g}.md)" in text} == guides
    index = (ROOT / "docs" / "site" / "guides" / "index.md").read_text()
    assert {line.strip() for line in index.splitlines()} >= guides


def test_the_front_page_example_prints_what_its_comment_says(capsys):
    _run("pyggml.silu(ctx, pyggml.scale(ctx, x, 0.5))")
    got = np.array([float(v) for v in re.findall(r"-?\d+\.\d+", capsys.readouterr().out)])
    x = np.array([1.0, -2.0, 3.0]) * 0.5
    np.testing.assert_allclose(got, x / (1 + np.exp(-x)), rtol=1e-6)


def test_scripting_example_prints_its_values(capsys):
    _run("a.numpy()[:] = np.arange(8)")
    printed = [float(v) for v in re.findall(r"[-\d.]+(?:e[-+]\d+)?", capsys.readouterr().out)]
    c = np.arange(8.0).reshape(2, 4) @ np.ones(4)                 # [6, 22]
    h = c / (1 + np.exp(-c))
    np.testing.assert_allclose(printed, np.concatenate([c, h / np.sqrt((h * h).mean() + 1e-6)]), rtol=1e-6)


def _rms(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g


def _rope_neox(t, hd):        # t (T, H, hd): pairs (i, i + hd/2) rotated by pos * 10000^(-2i/hd)
    half, T = hd // 2, t.shape[0]
    ang = np.arange(T)[:, None] * 10000.0 ** (-np.arange(half) * 2.0 / hd)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = t[..., :half], t[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def test_llama_block_matches_a_float64_transformer():
    ns = _run("swiglu_split")
    W, ids, T, H, hd, d = ns["W"], ns["ids"], ns["T"], ns["H"], ns["hd"], ns["d"]
    P = {k: v.astype(np.float64) for k, v in W.items()}
    x = P["emb"][ids]
    n = _rms(x, P["norm1"])
    q = _rope_neox((n @ P["wq"].T).reshape(T, H, hd), hd)
    k = _rope_neox((n @ P["wk"].T).reshape(T, H, hd), hd)
    v = (n @ P["wv"].T).reshape(T, H, hd)
    s = np.einsum("ihd,jhd->hij", q, k) * hd ** -0.5 + np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    x = x + np.einsum("hij,jhd->ihd", p, v).reshape(T, d) @ P["wo"].T
    n = _rms(x, P["norm2"])
    g, u = n @ P["gate"].T, n @ P["up"].T
    x = x + (g / (1 + np.exp(-g)) * u) @ P["down"].T
    out = ns["out"]
    assert out.shape == (T, d)
    assert ((out - x) ** 2).sum() / (x ** 2).sum() < 1e-10


def test_training_loop_is_adamw_on_the_true_gradient():
    ns = _run("opt_step_adamw")
    X, Y, init, losses = ns["X"].astype(np.float64), ns["Y"].astype(np.float64), ns["init"], ns["losses"]
    P = {k: np.array(v, np.float64) for k, v in init.items()}
    m = {k: np.zeros_like(v) for k, v in P.items()}
    v2 = {k: np.zeros_like(v) for k, v in P.items()}
    B = X.shape[0]
    want = []
    for step in range(1, 6):
        a = X @ P["w1"].T + P["b1"]
        h = a / (1 + np.exp(-a))                                  # silu
        z = h @ P["w2"].T + P["b2"]
        ls = z - z.max(-1, keepdims=True)
        ls = ls - np.log(np.exp(ls).sum(-1, keepdims=True))
        want.append(-(Y * ls).sum() / B)
        dz = (np.exp(ls) - Y) / B
        sig = 1 / (1 + np.exp(-a))
        da = (dz @ P["w2"]) * (sig * (1 + a * (1 - sig)))
        grads = {"w2": dz.T @ h, "b2": dz.sum(0), "w1": da.T @ X, "b1": da.sum(0)}
        lr, b1, b2 = 0.05, 0.9, 0.999
        for k in P:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v2[k] = b2 * v2[k] + (1 - b2) * grads[k] ** 2
            mh, vh = m[k] / (1 - b1 ** step), v2[k] / (1 - b2 ** step)
            P[k] = P[k] - lr * mh / (np.sqrt(vh) + 1e-8)
    np.testing.assert_allclose(losses[:5], want, rtol=1e-4)
    assert losses[-1] < losses[0] / 4 and ns["accuracy"] >= 0.9


def test_rpc_example_computes_on_the_server(capsys):
    import pyggml
    if pyggml.rpc_protocol() is None:
        pytest.skip("a build without ggml's RPC backend")
    _run("with pyggml.rpc.RPCServer() as server:")
    out = capsys.readouterr().out
    assert re.search(r"^RPC0\[127\.0\.0\.1:\d+\]$", out, re.M), out
    values = [float(v) for v in re.findall(r"\d+\.", out.split("]", 1)[1])]
    assert values == [4.0] * 6, out
