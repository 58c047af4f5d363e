"""examples/gemma3.py: Gemma 3 scripted with pyggml, against its float64 NumPy reference.

A tiny Gemma 3 written by gguf-py with random weights (7 layers: local ones and a global
one, a sliding window shorter than the prompt, grouped attention) runs always; the real
Gemma 3 270M where its package is installed (PYGGML_REQUIRE_MODEL=1 makes it required)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyggml
import pyggml.gguf as pg
from pyggml.reference import nmse

gguf = pytest.importorskip("gguf")
from gguf_files import real_model_path, write_gguf  # noqa: E402
ROOT = Path(__file__).resolve().parent.parent
from pyggml.models import gemma3  # noqa: E402
from pyggml.parity import cli as parity_cli  # noqa: E402
from pyggml.parity.models import TOL_CONVERTED, TOL_F32, compare_nodes  # noqa: E402

E, H, KVH, HD, FF, LAYERS, WINDOW = 64, 4, 1, 16, 96, 7, 3
PIECES = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + [
    "\u2581", "a", "b", "c", "\u2581a", "ab", "bc", "\u2581ab", "\u2581the", "t", "h", "e", "th", "he",
    "\u2581t", "\u2581th", "\t\t\t", "<start_of_turn>"]     # the last two: user-defined, control
SCORES = {"ab": -1.0, "bc": -0.5, "\u2581a": -0.2, "\u2581ab": -0.1, "th": -0.3, "he": -0.4,
          "\u2581t": -0.6, "\u2581th": -0.05, "\u2581the": -0.01}


def write_tiny_gemma3(path, quantize=False, seed=0):
    rng = np.random.default_rng(seed)
    kv = {f"gemma3.{key}": ("add_uint32", value) for key, value in [
        ("block_count", LAYERS), ("context_length", 128), ("embedding_length", E), ("feed_forward_length", FF),
        ("attention.head_count", H), ("attention.head_count_kv", KVH), ("attention.key_length", HD),
        ("attention.value_length", HD), ("attention.sliding_window", WINDOW)]}
    kv.update({
        "gemma3.attention.layer_norm_rms_epsilon": ("add_float32", 1e-6),
        "gemma3.rope.freq_base": ("add_float32", 1e6),
        "tokenizer.ggml.model": ("add_string", "llama"),
        "tokenizer.ggml.tokens": ("add_array", PIECES),
        "tokenizer.ggml.scores": ("add_array", [SCORES.get(p, -10.0) for p in PIECES]),
        "tokenizer.ggml.token_type": ("add_array", [3, 3, 3, 2] + [6] * 256 + [1] * (len(PIECES) - 262) + [4, 3]),
        "tokenizer.ggml.bos_token_id": ("add_uint32", 2),
        "tokenizer.ggml.eos_token_id": ("add_uint32", 1),
        "tokenizer.ggml.add_bos_token": ("add_bool", True),
        "tokenizer.ggml.add_space_prefix": ("add_bool", False),
    })
    tensors = {}

    def mat(name, shape):
        a = (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
        q8 = gguf.GGMLQuantizationType.Q8_0
        tensors[name] = (gguf.quants.quantize(a, q8), q8) if quantize else (a, None)

    def normw(name, n):
        tensors[name] = ((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None)

    mat("token_embd.weight", (len(PIECES), E))
    for il in range(LAYERS):
        p = f"blk.{il}."
        normw(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", (H * HD, E))
        mat(p + "attn_k.weight", (KVH * HD, E))
        mat(p + "attn_v.weight", (KVH * HD, E))
        normw(p + "attn_q_norm.weight", HD)
        normw(p + "attn_k_norm.weight", HD)
        mat(p + "attn_output.weight", (E, H * HD))
        normw(p + "post_attention_norm.weight", E)
        normw(p + "ffn_norm.weight", E)
        mat(p + "ffn_gate.weight", (FF, E))
        mat(p + "ffn_up.weight", (FF, E))
        mat(p + "ffn_down.weight", (E, FF))
        normw(p + "post_ffw_norm.weight", E)
    normw("output_norm.weight", E)
    return write_gguf(path, tensors, kv, arch="gemma3")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    return write_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny_q8.gguf", quantize=True)


PROMPT = [2, 270, 265, 261, 266, 264, 263, 261, 262]      # 9 tokens: the window (3) is shorter


def compare(model, tokens):
    """({node: NMSE}, nodes, reference) of pyggml's graph against the float64 reference,
    all tokens at once (what pyggml parity --model computes)."""
    return compare_nodes(gemma3, model, tokens)


def test_every_node_matches_float64_with_f32_weights(tiny):
    with pg.load(tiny) as f:
        model = gemma3.Gemma3(f, n_ctx=32, n_threads=2)
        errs, nodes, ref = compare(model, PROMPT)
    assert len(errs) == 2 + 6 * LAYERS + 1
    worst = max(errs, key=errs.get)
    # ggml's GELU reads an F16 table (the feed-forward outputs); everything else is float32 arithmetic
    assert errs[worst] < 1e-6, (worst, errs[worst])
    # before the first GELU, float32 arithmetic alone
    assert max(errs[k] for k in ("embd", "l0.q", "l0.k", "l0.probs", "l0.attn_out")) < 1e-10
    assert np.array_equal(nodes["logits"].argmax(-1), ref["logits"].argmax(-1))


def test_local_layers_see_only_their_window_and_the_global_one_everything(tiny):
    with pg.load(tiny) as f:
        model = gemma3.Gemma3(f, n_ctx=32)
        nodes = {}
        model.forward(PROMPT, all_logits=True, nodes=nodes)
    T = len(PROMPT)
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    for il in range(LAYERS):
        probs = nodes[f"l{il}.probs"]                              # (H, T, n_kv)
        hidden = (k > q) | ((q - k >= WINDOW) if il % 6 != 5 else False)
        assert (probs[:, hidden] == 0).all() and (probs[:, ~hidden] > 0).all(), il
        assert np.allclose(probs.sum(-1), 1, atol=1e-6)


def test_decoding_from_the_cache_gives_the_logits_of_the_whole_prompt(tiny):
    """The prompt's first 4 tokens in one graph, then one token per graph from the KV
    cache (the reused one-token graphs, here over spans of 4 positions, so that steps cross
    from one span's graph to the next): each step's logits are those of the same position
    computed all at once."""
    with pg.load(tiny) as f:
        whole = gemma3.Gemma3(f, n_ctx=32).forward(PROMPT, all_logits=True)
        model = gemma3.Gemma3(f, n_ctx=32)
        model.SPAN = 4
        steps = [model.forward(PROMPT[:4])]
        for t in PROMPT[4:]:
            steps.append(model.forward([t]))
        assert model.pos == len(PROMPT) and sorted(model.decode_steps) == [8, 12]
        for i, logits in enumerate(steps):
            assert nmse(logits.reshape(-1).astype(np.float64), whole[3 + i].astype(np.float64)) < 1e-7, i
        with pytest.raises(ValueError, match="the cache holds 32 positions"):
            model.forward([5] * 30)


def test_quantized_weights_carry_the_activation_quantization_error(tiny_q8):
    """With Q8_0 weights ggml quantizes each matrix product's activations to Q8_0 too: the
    error against float64 over the dequantized weights is that of 8-bit activations,
    largest after the matrix products and growing with depth, never an architecture error
    (which would be of order 1)."""
    with pg.load(tiny_q8) as f:
        model = gemma3.Gemma3(f, n_ctx=32)
        errs, nodes, ref = compare(model, PROMPT)
    assert errs["embd"] < 1e-12                    # get_rows dequantizes exactly
    assert 1e-6 < max(errs.values()) < 1e-2, max(errs.items(), key=lambda kv: kv[1])


def test_the_tokenizer_merges_by_score_and_falls_back_to_bytes(tiny):
    with pg.load(tiny) as f:
        tok = gemma3.Tokenizer(f.metadata)
    pieces = lambda text: [PIECES[i] for i in tok.encode(text)]  # noqa: E731
    assert pieces("abc") == ["<bos>", "a", "bc"]                 # bc (-0.5) merges before ab (-1.0)
    assert pieces(" ab") == ["<bos>", "\u2581ab"]
    assert pieces("the") == ["<bos>", "th", "e"]                  # th (-0.3) before he (-0.4); no "the"
    assert pieces(" the") == ["<bos>", "\u2581the"]
    assert pieces("é") == ["<bos>", "<0xC3>", "<0xA9>"]
    assert pieces("abab c") == ["<bos>", "ab", "ab", "\u2581", "c"]
    for text in ["abc", " the abc", "é a", "zz"]:
        assert tok.decode(tok.encode(text)) == text
    # special tokens, before the merges: user-defined ones always (no pair of tabs is a
    # piece, so merging alone could not make "\t\t\t"), control ones with special=True, as
    # llama.cpp's parse_special
    assert pieces("a\t\t\tb\t") == ["<bos>", "a", "\t\t\t", "b", "<0x09>"]
    assert pieces("a\t\t\t\tb") == ["<bos>", "a", "\t\t\t", "<0x09>", "b"]
    assert [PIECES[i] for i in tok.encode("<start_of_turn>ab", special=True)] == ["<bos>", "<start_of_turn>", "ab"]
    assert pieces("<start_of_turn>ab")[:3] == ["<bos>", "<0x3C>", "<0x73>"]          # its characters
    assert tok.decode(tok.encode("<start_of_turn>ab\t\t\t", special=True)) == "ab\t\t\t"   # control: nothing


def test_the_example_runs_from_the_command_line(tiny):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "gemma3.py"), "--model", str(tiny), "--tokens",
                           "5", "--threads", "1", "ab"], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ab") and "prompt tokens" in proc.stderr


# --- pyggml parity --model ----------------------------------------------------------------

def parity_model(*argv):
    """pyggml parity --model ... in this process: (exit status, stdout)."""
    import argparse
    import contextlib
    import io
    ap = argparse.ArgumentParser()
    parity_cli.add_arguments(ap)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = parity_cli.main(ap.parse_args(list(argv)), ap)
    return rc, out.getvalue()


@pytest.mark.parametrize("which", ["f32", "q8"])
def test_parity_model_checks_every_node_against_float64(which, tiny, tiny_q8, tmp_path):
    """pyggml parity --model on the tiny model: one row per named node, worst first, within
    the tolerance of its weights' class (F32: float32 rounding; Q8_0: 8-bit activations)."""
    path, tol = (tiny, TOL_F32) if which == "f32" else (tiny_q8, TOL_CONVERTED)
    out = tmp_path / "model.json"
    proc = subprocess.run([sys.executable, "-m", "pyggml", "parity", "--model", str(path), "--prompt", " the abc",
                           "--threads", "2", "--json", str(out), "--nodes", "0"],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows, meta = doc["rows"], doc["meta"]
    assert len(rows) == 2 + 6 * LAYERS + 1 and {r["verdict"] for r in rows} == {"ok"}
    assert {r["subject"] for r in rows} == {"model:gemma3"} and {r["tol"] for r in rows} == {tol}
    errs = [r["nmse"] for r in rows]
    assert errs == sorted(errs, reverse=True) and 0 < errs[0] < tol
    assert meta["types"] == (["F32"] if which == "f32" else ["F32", "Q8_0"])
    assert [PIECES[i] for i in meta["tokens"]] == ["<bos>", "\u2581the", "\u2581ab", "c"]
    assert meta["next_token_agrees"] == meta["positions"] == 4
    assert f"{len(rows)} nodes: {len(rows)} ok" in proc.stdout and rows[0]["case"] in proc.stdout


def test_parity_model_reports_a_node_that_departs_from_float64(tiny, monkeypatch):
    """A planted error (the reference's l3.ffn_out 1% off) fails that node and only it, and
    the exit status says so."""
    real = gemma3.reference_forward

    def planted(model, tokens):
        out = real(model, tokens)
        out["l3.ffn_out"] = out["l3.ffn_out"] * 1.01
        return out

    monkeypatch.setattr(gemma3, "reference_forward", planted)
    rc, out = parity_model("--model", str(tiny), "--nodes", "3")
    assert rc == 1
    lines = out.splitlines()
    assert lines[2].split()[0] == "l3.ffn_out" and lines[2].split()[-1] == "fail"
    assert f"{2 + 6 * LAYERS + 1} nodes: {2 + 6 * LAYERS} ok, 1 beyond the tolerance" in out


def test_parity_model_refuses_what_it_cannot_check(tiny, tmp_path, capsys):
    other = write_gguf(tmp_path / "llama.gguf", {"w": (np.ones(4, np.float32), None)}, arch="llama")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    assert parity_model("--model", str(other))[0] == 2
    assert "no pyggml model for the architecture 'llama' (written: gemma3)" in capsys.readouterr().err
    assert parity_model("--model", str(junk))[0] == 2
    assert "invalid magic" in capsys.readouterr().err
    for argv in (["--model", str(tiny), "--op", "add"], ["--model", str(tmp_path / "none.gguf")], ["--prompt", "x"]):
        with pytest.raises(SystemExit) as info:
            parity_model(*argv)
        assert info.value.code == 2


# --- the real model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    return real_model_path(tmp_path_factory)


def test_gemma3_270m_node_by_node_against_float64(real_model):
    """The real model on a real prompt: with its quantized weights, every node within the
    activation quantization's error and the same next token; with the weights dequantized
    to F32 (the same graph), every node within float32 rounding."""
    with pg.load(real_model) as f:
        tok = gemma3.Tokenizer(f.metadata)
        ids = tok.encode("The capital of France is")
        assert [tok.pieces[i] for i in ids] == ["<bos>", "The", "\u2581capital", "\u2581of", "\u2581France", "\u2581is"]
        model = gemma3.Gemma3(f, n_ctx=64)
        errs, nodes, ref = compare(model, ids)
        assert max(errs.values()) < 5e-2 and errs["logits"] < 1e-2, sorted(errs.items(), key=lambda kv: -kv[1])[:5]
        assert nodes["logits"][-1].argmax() == ref["logits"][-1].argmax()
        with pyggml.Context(1200 * 2 ** 20) as ctx:
            model32 = gemma3.Gemma3(f, n_ctx=64)
            model32.w = {k: ctx.from_numpy(gemma3.dequantized(t).astype(np.float32)) for k, t in f.tensors.items()}
            errs32 = {}
            nodes32 = {}
            model32.forward(ids, all_logits=True, nodes=nodes32)
            for k, r in ref.items():
                errs32[k] = nmse(nodes32[k].astype(np.float64).reshape(r.shape), r)
        assert max(errs32.values()) < 1e-5, max(errs32.items(), key=lambda kv: kv[1])


def test_the_benchmark_runs_pyggml_side_and_reports_per_thread_count(tiny, tmp_path):
    """scripts/bench_gemma3.py on the tiny model without llama.cpp (a smoke run: no speed
    asserted): greedy tokens per prompt and a speed row per thread count."""
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gemma3.py"), "--model", str(tiny),
                           "--no-llama", "--threads", "1,2", "--agree", "4", "--decode", "3", "--repeat", "1",
                           "--prompt-tokens", "8", "--json", str(out)], capture_output=True, text=True,
                          timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    doc = json.loads(out.read_text())
    assert [len(r["pyggml"]) for r in doc["agreement"]] == [4] * 4
    assert [r["threads"] for r in doc["speed"]] == [1, 2]
    assert all(r["pyggml_pp"] > 0 and r["pyggml_decode"] > 0 for r in doc["speed"])
    m = doc["memory"]                # the peak resident memory against the file and the cache
    assert m["hwm"] > 0 and m["cache"] == 2 * LAYERS * 1024 * HD * KVH * 4 and m["file"] == tiny.stat().st_size
    assert m["ratio"] == pytest.approx(m["hwm"] / (m["file"] + m["cache"])) and "memory (a fresh" in proc.stdout
    assert "CPU: " in proc.stdout


def test_gemma3_270m_tokenizer_splits_special_tokens(real_model):
    """Gemma 3's chat format: control tokens with special=True, their characters without;
    its user-defined newline runs always one token; where llama-cpp-python is installed,
    the same ids as llama.cpp's own tokenizer on texts that exercise all of it."""
    with pg.load(real_model) as f:
        tok = gemma3.Tokenizer(f.metadata)
        chat = "<start_of_turn>user\nHi<end_of_turn>\n"
        assert [tok.pieces[i] for i in tok.encode(chat, special=True)] == \
            ["<bos>", "<start_of_turn>", "user", "\n", "Hi", "<end_of_turn>", "\n"]
        plain = [tok.pieces[i] for i in tok.encode(chat)]
        assert "<start_of_turn>" not in plain and plain[1:8] == ["<", "start", "_", "of", "_", "turn", ">"]
        assert [tok.pieces[i] for i in tok.encode("a\n\n\nb")] == ["<bos>", "a", "\n\n\n", "b"]
        try:
            from llama_cpp import Llama
        except ImportError:
            return
        llm = Llama(model_path=str(real_model), vocab_only=True, verbose=False)
        texts = [chat + "<start_of_turn>model\n", "a\n\nb", "line1\n\n\n\nline2\t\t\tx", "  two  spaces   three",
                 "<eos>x<bos>", "<unused12>", "日本語のテキスト 🙂", "", " ", "\n", "x<mask>y", "[multimodal]",
                 "<start_of_image>img<end_of_image>", "tabs\t\tand" + "\n" * 33 + "end"]
        for special in (False, True):
            for text in texts:
                assert tok.encode(text, special=special) == \
                    llm.tokenize(text.encode(), add_bos=True, special=special), (text, special)


def test_parity_model_on_gemma3_270m(real_model):
    """pyggml parity --model on the real model: every named node within the tolerance of
    quantized weights, the same next token as float64 at every position of the prompt."""
    rc, out = parity_model("--model", str(real_model), "--nodes", "0")
    assert rc == 0, out
    assert "gemma3 (F32, Q4_K, Q5_0, Q6_K, Q8_0), 6 tokens of 'The capital of France is'" in out
    assert f"{2 + 6 * 18 + 1} nodes: {2 + 6 * 18 + 1} ok, 0 beyond the tolerance; next token as float64's at " \
           "6 of 6 positions" in out
