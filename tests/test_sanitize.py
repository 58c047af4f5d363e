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


@pytest.mark.parametrize("typ, check", [("Q1_0", "misaligned address"), ("IQ3_S", "left shift")])
def test_the_recorded_upstream_ub_is_real_and_only_it_is_suppressed(typ, check):
    # the UB of the records with Defect.ubsan, reached through mul_mat: UBSan stops the
    # process without the suppressions scripts/sanitize.py writes, and lets it finish with them
    import os
    import re

    from pyggml import defects
    code = textwrap.dedent(f"""
        import numpy as np, pyggml
        from pyggml.opinfo import registry
        from pyggml.opinfo.harness import run
        info = registry()["mul_mat"]
        sample = next(iter(info.samples(np.random.default_rng(0), pyggml.Type.{typ})))
        print(run(info, sample).nmse < 5e-4)
    """)
    opts = os.environ.get("UBSAN_OPTIONS", "")
    bare = re.sub(r":?suppressions=[^:]*", "", opts) + ":halt_on_error=1"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                          env=dict(os.environ, UBSAN_OPTIONS=bare))
    assert proc.returncode != 0 and "runtime error" in proc.stderr and check in proc.stderr, proc.stderr[-2000:]
    site = re.search(r"quants\.c:\d+", proc.stderr)
    assert site and any(typ.lower() in s for d in defects.DEFECTS for s in d.ubsan), proc.stderr[-2000:]
    assert "suppressions=" in opts           # scripts/sanitize.py's run
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr[-2000:]
