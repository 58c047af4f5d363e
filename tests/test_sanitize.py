"""What the sanitizer build (scripts/sanitize.py) adds: poisoned pools. Skipped in a
normal build (pyggml.ASAN is False there)."""

import subprocess
import sys
import textwrap

import pytest

import pyggml

pytestmark = pytest.mark.skipif(not pyggml._core.ASAN, reason="needs the ASan build of scripts/sanitize.py")


def test_asan_catches_the_flash_attn_back_overrun_inside_a_pool():
    # the batch + GQA configuration of the known defect, built past pyggml's refusal (the
    # defect probe's own node, without its padding): the kernel writes 768 bytes past its
    # result, into the poisoned tail of the pool, and ASan stops the process there
    code = textwrap.dedent("""
        import numpy as np, pyggml
        from pyggml.opinfo.harness import rules_disabled
        D, N, M, ne2, kvne2, ne3 = 16, 6, 6, 4, 2, 2
        with rules_disabled(), pyggml.Context(1 << 20) as ctx:
            rng = np.random.default_rng(0)
            q = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
            k = ctx.from_numpy(rng.standard_normal((ne3, kvne2, M, D), dtype=np.float32))
            v = ctx.from_numpy(rng.standard_normal((ne3, kvne2, D, M), dtype=np.float32))
            d = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
            r = pyggml.flash_attn_back(ctx, q, k, v, d, False)
            g = pyggml.Graph(pyggml.Context(1 << 16), 16)   # not after r in ctx's pool
            g.build_forward_expand(r)
            pyggml._cpu._compute_without_proof(g, 1)
        print("no report")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode != 0
    assert "AddressSanitizer" in proc.stderr and "use-after-poison" in proc.stderr
    assert "flash_attn_back" in proc.stderr
