"""Both sides of the [attention] family's kernel rules (pyggml/csrc/rules_attention.c).

For every refusal clause: pyggml raises the right class at the op call, and the same node
with the rules off shows that the CPU kernel really fails (an abort, an out-of-bounds
access caught by the guarded proof, or wrong values against the float64 reference). The
accepted side is the op-information registry's (pyggml/opinfo/attention.py).

Also here: what the review of the core rules for SOFT_MAX and DIAG_MASK_* found, and the
F16 accumulation of flash_attn_ext's split-KV path, which has its own error bound.
"""

import math

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import attention as A
from pyggml.opinfo.harness import kernel_verdict, nmse, read, rules_disabled
from rules_helpers import compute_unchecked, refused

RNG = np.random.default_rng(20260514)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def positions(n):
    return RNG.integers(-8, 40, n).astype(np.int32)




# --- ROPE -------------------------------------------------------------------------------------------

def rope_build(x, pos, n_dims, mode, c=None, sections=None, inplace=False, yarn=A._PLAIN, x_type=None):
    def build(ctx):
        a = ctx.from_numpy(x if x_type is None else x.astype(x_type))
        b = ctx.from_numpy(pos)
        ct = ctx.from_numpy(c) if c is not None else None
        if sections is not None:
            f = pyggml.rope_multi_inplace if inplace else pyggml.rope_multi
            return f(ctx, a, b, ct, n_dims, sections, mode, *yarn)
        f = pyggml.rope_ext_inplace if inplace else pyggml.rope_ext
        return f(ctx, a, b, ct, n_dims, mode, *yarn)
    return build


def test_rope_src0_type():
    x = f32(3, 2, 8)

    def build(ctx):
        bits = pyggml.quantize(Type.BF16, x).view(np.uint16)
        return pyggml.rope(ctx, ctx.from_numpy(bits, type=Type.BF16), ctx.from_numpy(positions(3)), 8, 0)
    refused(build, pyggml.GGMLTypeError, r"ROPE node refused: the CPU kernel does not take src0 of type bf16")
    assert kernel_verdict(build) == "abort"


def test_rope_src0_rows_must_be_contiguous():
    x = f32(3, 8, 8)

    def build(ctx):
        a = pyggml.permute(ctx, ctx.from_numpy(x), 1, 0, 2, 3)     # transposed rows
        return pyggml.rope(ctx, a, ctx.from_numpy(positions(3)), 8, 0)
    refused(build, pyggml.KernelPreconditionError, r"ROPE node refused: src0 must have contiguous rows")
    assert kernel_verdict(build) == "abort"                         # GGML_ASSERT(nb0 == nb00)


def test_rope_positions_must_be_contiguous():
    # b a vector (ggml_is_vector) whose elements are 8 bytes apart: the kernel reads pos[i2]
    # as a packed array, so it takes the interleaved values
    x = f32(4, 2, 8)
    pos = positions(4)
    pairs = np.stack([pos, np.int32(1000) + pos], axis=1)            # (4, 2): ggml ne (2, 4)

    def build(ctx):
        base = ctx.from_numpy(pairs)
        b = pyggml.transpose(ctx, pyggml.view_2d(ctx, base, 1, 4, 8, 0))   # ne (4, 1), nb (8, 4)
        assert b.nb[0] == 8
        return pyggml.rope(ctx, ctx.from_numpy(x), b, 8, 0)
    refused(build, pyggml.KernelPreconditionError, r"the positions \(src1\) must have contiguous rows")
    got = compute_unchecked(build)
    want = A.rope_reference(x, pos, None, 8, None, 0)
    assert nmse(got, want) > 1e-2
    read_as = pairs.reshape(-1)[:4]                                   # p0, 1000+p0, p1, 1000+p1
    assert nmse(got, A.rope_reference(x, read_as, None, 8, None, 0)) < 1e-10


def test_rope_mode_the_kernel_lacks():
    x = f32(3, 2, 8)
    build = rope_build(x, positions(3), 8, 4)                         # bit 2: no such mode
    refused(build, pyggml.KernelPreconditionError, r"mode 4 is not one the CPU kernel takes")
    assert kernel_verdict(build) == "abort"                           # "rope type not supported"
    # NEOX | MROPE: the builder takes it as a multi mode, the kernel's switch does not
    build = rope_build(f32(3, 2, 8), positions(12), 8, 10, sections=(2, 2, 0, 0))
    refused(build, pyggml.KernelPreconditionError, r"mode 10 is not one the CPU kernel takes")
    assert kernel_verdict(build) == "abort"


def test_imrope_is_what_a_ggml_without_it_lacks():
    # mode 40 (IMROPE): a ggml whose ggml.h lacks it (0.9.4) tests mode & MROPE, takes 40 for
    # MROPE and rotates by other angles, silently (NMSE 0.02-0.7 against IMROPE there)
    from sources import built_from_the_pin

    build = rope_build(f32(3, 2, 16), positions(12), 16, 40, sections=(3, 3, 2, 0))
    if pyggml.build_info()["features"]["rope_imrope"]:
        with pyggml.Context(1 << 20) as ctx:
            assert build(ctx).op == "ROPE"       # (its values: the IMROPE samples of test_opinfo)
        return
    assert not built_from_the_pin()
    refused(build, pyggml.GGMLVersionError, r"mode 40 \(IMROPE\) is not in this ggml .* take it for MROPE")
    assert kernel_verdict(build) == "ok"                # what the refusal stands for: no abort, other values


@pytest.mark.parametrize("n_dims", [3, 10])
def test_rope_n_dims_odd_or_too_large(n_dims):
    build = rope_build(f32(3, 2, 8), positions(3), n_dims, 0)
    refused(build, pyggml.KernelPreconditionError, rf"n_dims must be even and in \[0, ne0 = 8\], got {n_dims}")
    assert kernel_verdict(build) == "abort"


def test_rope_negative_n_dims_reads_before_the_rows():
    # 16*8*8 floats = 4096 bytes: the guarded proof puts src0's first byte right after a
    # guard page, and the tail copy (from i0 = n_dims = -2) reads src0[-2]
    build = rope_build(f32(8, 8, 16), positions(8), -2, 0)
    refused(build, pyggml.KernelPreconditionError, r"n_dims must be even and in \[0, ne0 = 16\], got -2")
    assert kernel_verdict(build) == "out-of-bounds"


def test_rope_multi_sections():
    x = f32(3, 2, 8)
    # MROPE through rope_ext: no sections (zeros), GGML_ASSERT(sections[0] > 0 || ...)
    build = rope_build(x, positions(12), 8, A.ROPE_MROPE)
    refused(build, pyggml.KernelPreconditionError, r"mode 8 needs sections\[0\], \[1\] or \[2\] > 0")
    assert kernel_verdict(build) == "abort"
    # sections adding up to 0: the sector is i % 0 (SIGFPE)
    build = rope_build(x, positions(12), 8, A.ROPE_MROPE, sections=(1, -1, 0, 0))
    refused(build, pyggml.KernelPreconditionError, r"sections must be >= 0, got \(1, -1, 0, 0\)")
    assert kernel_verdict(build) == "abort"
    # more section dims than ne0: GGML_ASSERT(sect_dims <= ne0)
    build = rope_build(x, positions(12), 8, A.ROPE_IMROPE, sections=(4, 4, 2, 0))
    refused(build, pyggml.KernelPreconditionError, r"the sections add up to 10, more than ne0 = 8")
    assert kernel_verdict(build) == "abort"


def test_rope_vision_n_dims():
    build = rope_build(f32(3, 2, 16), positions(12), 4, A.ROPE_VISION, sections=(2, 2, 0, 0))
    refused(build, pyggml.KernelPreconditionError, r"VISION mode needs n_dims == ne0/2 = 8, got 4")
    assert kernel_verdict(build) == "abort"


def test_rope_vision_section_after_an_empty_one():
    # ggml_mrope_cache_init restarts each VISION section's angles with an else-if chain on
    # the section starts: after an empty h section, w starts where h does, h's branch wins,
    # and w's angles go on from the t section's
    x = f32(2, 2, 8)
    pos = np.arange(1, 9, dtype=np.int32)
    build = rope_build(x, pos, 4, A.ROPE_VISION, sections=(2, 0, 2, 0))
    refused(build, pyggml.UpstreamDefect, r"VISION sections \(2, 0, 2, 0\): a section after an empty one",
            defect="rope-vision-section-reset")
    got = compute_unchecked(build)
    want = A.rope_reference(x, pos, None, 4, (2, 0, 2, 0), A.ROPE_VISION)
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-6)
    assert bad[..., [2, 3, 6, 7]].any() and not bad[..., [0, 1, 4, 5]].any()   # the w pairs (2, 6), (3, 7)
    # what the kernel computes: the w pairs' angles counted from the start of the row
    # (pairs 2, 3 turn by p_w * theta_scale**2, **3 instead of **0, **1: frequency factors
    # of theta_scale**-2 say the same to the reference)
    theta_scale = 10000.0 ** (-2 / 4)
    c = np.array([1.0, 1.0, theta_scale ** -2, theta_scale ** -2])
    assert nmse(got, A.rope_reference(x, pos, c, 4, (2, 0, 2, 0), A.ROPE_VISION)) < 1e-10


def _vision_chain_restarts(sections, n_pairs):
    """ggml_mrope_cache_init's else-if chain of VISION resets, replayed pair by pair (what
    the rule did before it took the closed form): True when every pair gets its
    section-local exponent"""
    start = [0, sections[0], sections[0] + sections[1], sum(sections[:3])]
    sect_dims = start[3] + sections[3]
    expo = [0, 0, 0, 0]
    for i in range(n_pairs):
        sector = i % sect_dims
        for k in range(4):
            if sector == start[k]:
                expo[k] = 0
                break
        which = 0
        while which < 3 and sector >= start[which + 1]:
            which += 1
        if expo[which] != sector - start[which]:
            return False
        expo = [e + 1 for e in expo]
    return True


def test_rope_vision_section_rule_equals_the_replayed_chain():
    """the rule's closed form against the chain replayed over every pair: random sections
    (empty ones included) and row lengths"""
    rng = np.random.default_rng(11)
    seen = set()
    for _ in range(300):
        sections = tuple(int(v) for v in rng.integers(0, 4, 4))
        if max(sections[:3]) == 0:
            continue
        n_dims = int(rng.integers(max(1, (sum(sections) + 1) // 2), 24)) * 2      # sum(sections) <= ne0
        want = _vision_chain_restarts(sections, n_dims)
        with pyggml.Context(1 << 20, no_alloc=True) as ctx:
            a, pos = ctx.new_tensor(Type.F32, (2 * n_dims, 1, 2)), ctx.new_tensor(Type.I32, (8,))
            try:
                pyggml.rope_multi(ctx, a, pos, None, n_dims, list(sections), A.ROPE_VISION, *A._PLAIN)
                got = True
            except pyggml.UpstreamDefect as e:
                assert e.defect == "rope-vision-section-reset"
                got = False
        assert got == want, (sections, n_dims)
        seen.add(got)
    assert seen == {True, False}


def test_rope_vision_section_rule_returns_at_once_on_a_long_row():
    """2**30 pairs: the replayed chain took 4.6 s (GIL held); the closed form microseconds"""
    import time
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        n_dims = 2**30
        a, pos = ctx.new_tensor(Type.F32, (2 * n_dims, 1, 1)), ctx.new_tensor(Type.I32, (4,))
        t0 = time.monotonic()
        t = pyggml.rope_multi(ctx, a, pos, None, n_dims, [5, 5, 0, 0], A.ROPE_VISION, *A._PLAIN)
        assert time.monotonic() - t0 < 0.5
        assert t.ne[0] == 2 * n_dims


@pytest.mark.parametrize("mode, n_dims", [(A.ROPE_NORMAL, 2), (A.ROPE_NEOX, 4)])
def test_rope_odd_ne0_runs_past_the_rows(mode, n_dims):
    # 5*4*3 floats = 240 bytes, a multiple of 16: no canary slack, the guard page follows
    build = rope_build(f32(3, 4, 5), positions(3), n_dims, mode)
    refused(build, pyggml.UpstreamDefect, r"ne0 = 5 is odd", defect="rope-odd-ne0")
    assert kernel_verdict(build) == "out-of-bounds"


def test_rope_odd_ne0_inside_a_tensor_turns_the_wrong_elements():
    # rows followed by more data: the overrun lands in the next row, and with two threads
    # it can overwrite a rotated element with its unrotated value; the last row of the
    # VISION mode's odd ne0 rotates element n_dims a second time (pair (n_dims, 2*n_dims))
    x = f32(2, 2, 9)
    pos = positions(8)
    build = rope_build(x, pos, 4, A.ROPE_VISION, sections=(2, 2, 0, 0))
    refused(build, pyggml.UpstreamDefect, r"ne0 = 9 is odd", defect="rope-odd-ne0")
    got = compute_unchecked(build)
    want = A.rope_reference(x, pos, None, 4, (2, 2, 0, 0), A.ROPE_VISION)   # element 8 unpaired: copied
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-6)
    assert bad[..., 4].all() and bad[..., 8].all() and not bad[..., [0, 1, 2, 3, 5, 6, 7]].any()


def test_rope_freq_factors_must_be_contiguous():
    # values of its own (the module's RNG is in whatever state the tests before it left it:
    # some draws put the two references closer than the bound below)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    pos = rng.integers(-8, 40, 3).astype(np.int32)
    ff = rng.uniform(0.5, 4.0, 4).astype(np.float32)
    pairs = np.stack([ff, np.float32(100.0) + ff], axis=1)            # ggml ne (2, 4)

    def build(ctx):
        c = pyggml.transpose(ctx, pyggml.view_2d(ctx, ctx.from_numpy(pairs), 1, 4, 8, 0))   # ne (4, 1), nb (8, 4)
        return pyggml.rope_ext(ctx, ctx.from_numpy(x), ctx.from_numpy(pos), c, 8, 0, *A._PLAIN)
    refused(build, pyggml.KernelPreconditionError, r"the frequency factors \(src2\) must have contiguous rows")
    got = compute_unchecked(build)
    assert nmse(got, A.rope_reference(x, pos, ff, 8, None, 0)) > 1e-3
    assert nmse(got, A.rope_reference(x, pos, pairs.reshape(-1)[:4], 8, None, 0)) < 1e-10


def test_rope_freq_factors_past_n_dims():
    # the builder asks for n_dims/2 factors; the kernel reads ne0/2 of them (and VISION uses them)
    ff = RNG.uniform(0.5, 4.0, 2).astype(np.float32)
    build = rope_build(f32(3, 2, 16), positions(3), 4, A.ROPE_NEOX, c=ff)
    refused(build, pyggml.UpstreamDefect, r"reads a frequency factor for each of the ne0/2 = 8 pairs",
            defect="rope-freq-factors-oob")
    assert kernel_verdict(build) == "out-of-bounds"
    ff = RNG.uniform(0.5, 4.0, 4).astype(np.float32)
    build = rope_build(f32(2, 2, 16), positions(8), 8, A.ROPE_VISION, c=ff, sections=(2, 2, 0, 0))
    refused(build, pyggml.UpstreamDefect, r"src2 has 4", defect="rope-freq-factors-oob")
    assert kernel_verdict(build) == "out-of-bounds"


def test_rope_accepts_what_the_kernel_handles():
    # rows contiguous, dims 1 and 2 swapped (as q, k are in attention graphs)
    x = f32(2, 3, 4, 8)
    pos = positions(4)
    with pyggml.Context(16 << 20) as ctx:
        a = pyggml.permute(ctx, ctx.from_numpy(x), 0, 2, 1, 3)        # ne (8, 3, 4, 2)
        r = pyggml.rope(ctx, a, ctx.from_numpy(pos), 4, A.ROPE_NEOX)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(r)
        g.compute(2)
        got = read(r)
    want = A.rope_reference(np.swapaxes(x, 1, 2), pos, None, 4, None, A.ROPE_NEOX)
    assert nmse(got, want) < 1e-10


# --- FLASH_ATTN_EXT ---------------------------------------------------------------------------------

def fa_build(qs=(1, 2, 3, 8), ks=(1, 2, 5, 8), vs=None, ms=None, qt=np.float32, kt=np.float32, vt=None,
             q_view=None, k_view=None, v_view=None, mask_value=0.0):
    vs = vs or ks
    q, k, v = f32(*qs), f32(*ks), f32(*vs)
    mask = np.full(ms, mask_value, np.float16) if ms else None

    def build(ctx):
        tq = ctx.from_numpy(q.astype(qt))
        tk = ctx.from_numpy(k.astype(kt))
        tv = ctx.from_numpy(v.astype(vt or kt))
        tq, tk, tv = (f(ctx, x) if f else x for f, x in ((q_view, tq), (k_view, tk), (v_view, tv)))
        tm = ctx.from_numpy(mask) if mask is not None else None
        return pyggml.flash_attn_ext(ctx, tq, tk, tv, tm, 1 / math.sqrt(qs[-1]), 0.0, 0.0)
    return build


def test_fa_q_must_be_f32():
    build = fa_build(qt=np.float16, kt=np.float16)
    refused(build, pyggml.GGMLTypeError, r"FLASH_ATTN_EXT node refused: the CPU kernel does not take q \(src0\) "
                                         r"of type f16")
    assert kernel_verdict(build) == "out-of-bounds"                   # q rows read as float: twice their bytes


def test_fa_k_and_v_types():
    build = fa_build(kt=np.int32, vt=np.float32)
    refused(build, pyggml.GGMLTypeError, r"no dot product for k \(src1\) of type i32")
    assert kernel_verdict(build) == "abort"                           # a NULL vec_dot is called
    build = fa_build(kt=np.float32, vt=np.int32)
    refused(build, pyggml.GGMLTypeError, r"cannot read v \(src2\) of type i32")
    assert kernel_verdict(build) == "abort"                           # GGML_ASSERT "fattn: unsupported V-type"


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_fa_rows_must_be_contiguous(which):
    def tr(ctx, x):
        return pyggml.transpose(ctx, pyggml.cont(ctx, pyggml.transpose(ctx, x)))   # same ne, rows strided
    build = fa_build(qs=(1, 2, 8, 8), ks=(1, 2, 8, 8), **{f"{which}_view": tr})
    refused(build, pyggml.KernelPreconditionError, rf"{which} \(src\d\) must have contiguous rows")
    assert kernel_verdict(build) == "abort"


def test_fa_v_shape():
    build = fa_build(ks=(1, 2, 6, 16), vs=(1, 2, 3, 16), qs=(1, 2, 4, 16))
    refused(build, pyggml.KernelPreconditionError, r"v \(src2\) has 3 rows, fewer than k's 6 keys")
    assert kernel_verdict(build) == "out-of-bounds"
    build = fa_build(qs=(1, 4, 4, 16), ks=(1, 2, 6, 16), vs=(1, 3, 6, 16))
    refused(build, pyggml.KernelPreconditionError, r"v's head count \(ne\[2\] = 3\) must divide q's \(4\)")
    assert kernel_verdict(build) == "out-of-bounds"


def test_fa_mask_shape():
    # an F16 mask of exactly 32 bytes: no canary slack, the guard page follows it
    build = fa_build(qs=(1, 2, 4, 8), ks=(1, 2, 6, 8), ms=(1, 1, 4, 4))
    refused(build, pyggml.KernelPreconditionError, r"the mask \(src3\) must be at least \[n_kv = 6, n_batch = 4\], "
                                                   r"got \[4, 4\]")
    assert kernel_verdict(build) == "out-of-bounds"
    build = fa_build(qs=(1, 2, 4, 8), ks=(1, 2, 8, 8), ms=(1, 1, 2, 8))
    refused(build, pyggml.KernelPreconditionError, r"got \[8, 2\]")
    assert kernel_verdict(build) == "out-of-bounds"


def _fa_decode(kt, n_kv=512):
    q, k, v = f32(1, 2, 1, 8), f32(1, 1, n_kv, 8), f32(1, 1, n_kv, 8)
    with pyggml.Context(16 << 20) as ctx:
        r = pyggml.flash_attn_ext(ctx, ctx.from_numpy(q), ctx.from_numpy(k.astype(kt)), ctx.from_numpy(v.astype(kt)),
                                  None, 1 / math.sqrt(8), 0.0, 0.0)
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(r)
        g.compute(1)
        got = read(r)
    ks, vs = (x.astype(kt).astype(np.float64) for x in (k, v))
    return got, A.flash_attn_reference(q, ks, vs, None, 1 / math.sqrt(8), 0.0, 0.0).reshape(got.shape)


def test_fa_split_kv_f16_accumulates_in_f16():
    # the defect fattn-f16-v-accumulator: with F16 V the one-chunk kernel (fewer than 64 query
    # rows, and the split-KV decode path: 1 query, >= 512 keys) accumulates softmax*V in F16 (VKQ16, ggml_vec_mad_f16), whatever
    # the precision asked for: the error grows with n_kv, far past the F16 rounding of q
    # (measured NMSE ~1e-5 at 500 keys, 5e-8 with an F32 V; the tiled path, >= 64 queries,
    # accumulates in F32)
    got32, want32 = _fa_decode(np.float32)
    assert nmse(got32, want32) < 1e-10
    got, want = _fa_decode(np.float16)
    err = nmse(got, want)
    assert 1e-7 < err < 1e-3, err


def test_fa_prec_f32_does_not_change_the_cpu_result():
    q, k, v = f32(1, 2, 1, 8), f32(1, 1, 512, 8).astype(np.float16), f32(1, 1, 512, 8).astype(np.float16)
    outs = []
    for prec in (None, pyggml.Prec.F32):
        with pyggml.Context(16 << 20) as ctx:
            r = pyggml.flash_attn_ext(ctx, ctx.from_numpy(q), ctx.from_numpy(k), ctx.from_numpy(v), None,
                                      1 / math.sqrt(8), 0.0, 0.0)
            if prec is not None:
                pyggml.flash_attn_ext_set_prec(r, prec)
            g = pyggml.Graph(ctx, 8)
            g.build_forward_expand(r)
            g.compute(1)
            outs.append(read(r))
    np.testing.assert_array_equal(outs[0], outs[1])


def _fa_node(ctx, q, k, v):
    return pyggml.flash_attn_ext(ctx, ctx.from_numpy(q), ctx.from_numpy(k), ctx.from_numpy(v), None,
                                 1 / math.sqrt(q.shape[-1]), 0.0, 0.0)


def test_fa_n_kv_max_is_set_where_ggml_has_it_and_the_cpu_ignores_it():
    """ggml_flash_attn_ext_set_n_kv_max (after 0.20.2) stores the bound in op_params[4]; the
    CPU kernel does not read it: the values are those without it"""
    q, k, v = f32(1, 2, 1, 8), f32(1, 1, 64, 8).astype(np.float16), f32(1, 1, 64, 8).astype(np.float16)
    from pyggml import _optable
    with pyggml.Context(16 << 20) as ctx:
        r = _fa_node(ctx, q, k, v)
        if "ggml_flash_attn_ext_set_n_kv_max" not in _optable.API:      # the linked ggml.h's GGML_API functions
            with pytest.raises(pyggml.GGMLVersionError, match="newer than this ggml"):
                pyggml.flash_attn_ext_set_n_kv_max(r, 16)
            return
        pyggml.flash_attn_ext_set_n_kv_max(r, 16)
        assert r.op_params[4] == 16
        plain = _fa_node(ctx, q, k, v)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(r)
        g.build_forward_expand(plain)
        g.compute(1)
        np.testing.assert_array_equal(read(r), read(plain))
        with pytest.raises(pyggml.ArgumentError, match="must be >= 0"):
            pyggml.flash_attn_ext_set_n_kv_max(r, -1)
        with pytest.raises(pyggml.ArgumentError, match="FLASH_ATTN_EXT node, not ADD"):
            pyggml.flash_attn_ext_set_n_kv_max(pyggml.add(ctx, ctx.from_numpy(q), ctx.from_numpy(q)), 4)
        assert r.op_params[4] == 16             # a refusal leaves the node as it was


# --- GET_REL_POS ------------------------------------------------------------------------------------

def test_get_rel_pos_type():
    def build(ctx):
        return pyggml.get_rel_pos(ctx, ctx.from_numpy(f32(5, 4)), 3, 3)
    refused(build, pyggml.GGMLTypeError, r"GET_REL_POS node refused: the CPU kernel does not take src0 of type f32")
    assert kernel_verdict(build) == "abort"


def test_get_rel_pos_bf16_result_holds_bf16_bits():
    x = f32(5, 4)
    bits = pyggml.quantize(Type.BF16, x).view(np.uint16)

    def build(ctx):
        return pyggml.get_rel_pos(ctx, ctx.from_numpy(bits, type=Type.BF16), 3, 3)
    refused(build, pyggml.UpstreamDefect, r"a BF16 src0 is copied bit for bit into the f16 result",
            defect="get-rel-pos-bf16")
    got = compute_unchecked(build)                                    # an F16 tensor
    table = pyggml.dequantize(Type.BF16, bits, x.shape).astype(np.float64)
    want = A._ref_get_rel_pos(table, 3, 3)
    assert nmse(got, want) > 1e-1
    np.testing.assert_array_equal(got, A._ref_get_rel_pos(bits, 3, 3).view(np.float16))


def test_get_rel_pos_packed_rows():
    x = RNG.standard_normal((5, 8)).astype(np.float16)

    def build(ctx):
        a = pyggml.view_2d(ctx, ctx.from_numpy(x), 4, 5, 16, 0)      # rows of 4 of 8: nb1 = 16
        return pyggml.get_rel_pos(ctx, a, 3, 3)
    refused(build, pyggml.KernelPreconditionError, r"src0 must have packed rows")
    got = compute_unchecked(build)
    assert nmse(got, A._ref_get_rel_pos(x[:, :4].astype(np.float64), 3, 3)) > 1e-2
    np.testing.assert_array_equal(got, A._ref_get_rel_pos(x.reshape(-1)[:20].reshape(5, 4), 3, 3))


# --- ADD_REL_POS ------------------------------------------------------------------------------------

def test_add_rel_pos_type():
    def build(ctx):
        a = ctx.from_numpy(f32(2, 6, 9).astype(np.float16))
        return pyggml.add_rel_pos(ctx, a, ctx.from_numpy(f32(2, 3, 2, 3)), ctx.from_numpy(f32(2, 3, 2, 3)))
    refused(build, pyggml.GGMLTypeError, r"ADD_REL_POS node refused: the CPU kernel does not take src0 of type f16")
    assert kernel_verdict(build) == "abort"


def test_add_rel_pos_ignores_a_ne3():
    # values of its own: with the module's RNG in some states (which tests ran before it on
    # this worker) a float32 sum missed rtol=1e-6
    rng = np.random.default_rng(3)
    a, pw, ph = (rng.standard_normal(sh).astype(np.float32) for sh in ((2, 2, 4, 4), (2, 2, 2, 2), (2, 2, 2, 2)))

    def build(ctx):
        return pyggml.add_rel_pos(ctx, ctx.from_numpy(a), ctx.from_numpy(pw), ctx.from_numpy(ph))
    refused(build, pyggml.UpstreamDefect, r"src0 has ne\[3\] = 2", defect="add-rel-pos-ne3")
    got = compute_unchecked(build)
    np.testing.assert_allclose(got[0], A._ref_add_rel_pos(a[0], pw, ph), rtol=1e-6)
    np.testing.assert_array_equal(got[1], a[1])                       # untouched


# --- the core rules of SOFT_MAX and DIAG_MASK_*: what the review found --------------------------

def test_soft_max_alibi_backward_aborts():
    # ggml_compute_backward passes max_bias on to soft_max_ext_back, whose CPU kernel asserts
    # max_bias == 0 (the gradient with respect to a does not depend on it)
    a, m = f32(1, 4, 3, 6), f32(1, 1, 3, 6)
    with pyggml.Context(16 << 20) as ctx:
        ta = ctx.from_numpy(a)
        pyggml.set_param(ta)
        y = pyggml.soft_max_ext(ctx, ta, ctx.from_numpy(m), 0.5, 8.0)
        loss = pyggml.sum(ctx, pyggml.mul(ctx, y, ctx.from_numpy(f32(1, 4, 3, 6))))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 256, grads=True)
        g.build_forward_expand(loss)
        with pytest.raises(pyggml.UpstreamDefect, match="max_bias=8") as info:
            g.build_backward_expand()       # refused before ggml builds the backward pass
        assert info.value.defect == "soft-max-alibi-grad"
        assert g.n_nodes == 4               # the forward graph is left as it was


def test_diag_mask_inplace_kernel_handles_strided_rows():
    # in place the kernel copies nothing and walks rows with nb[1] and nb[2]: rows of a
    # strided view are masked right (the core rule asks for a contiguous src0 all the same)
    x = f32(2, 3, 8)
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        base = ctx.from_numpy(x)
        v = pyggml.view_3d(ctx, base, 5, 3, 2, base.nb[1], base.nb[2], 0)
        r = pyggml.diag_mask_inf_inplace(ctx, v, 1)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(r)
        g.compute(2)
        got = base.numpy().copy()
    want = x.astype(np.float64)
    want[..., :5] = A._ref_diag_mask(-np.inf)(want[..., :5], 1)
    assert nmse(got, want) == 0.0


def test_soft_max_kernel_handles_unit_rows_with_odd_nb0():
    # ggml_is_contiguous ignores the stride of a dimension of size 1; the kernel reads one
    # element per row: softmax of one element is 1 (the core rule asks nb[0] == 4)
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        a = pyggml.transpose(ctx, ctx.from_numpy(f32(1, 5)))         # ne (1, 5), nb (20, 4)
        assert a.nb[0] == 20
        r = pyggml.soft_max(ctx, a)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(r)
        g.compute(1)
        np.testing.assert_array_equal(read(r), np.ones((5, 1)))


# --- ROPE's offset (ggml_rope_set_offset, in ggml after 0.20.2) -------------------------------

def _rope_offset_available():
    with pyggml.Context(1 << 20) as ctx:
        r = _rope_node(ctx, np.zeros((1, 1, 8), np.float32))
        try:
            pyggml.rope_set_offset(r, 0)
        except pyggml.GGMLVersionError:
            return False
    return True


def _rotated(x, offs, n_dims):
    """NORMAL-mode rope of x (numpy (positions, heads, ne0); position p = its index,
    freq_base 10000) on the n_dims elements from ``offs``, in float64"""
    y = x.astype(np.float64).copy()
    for p in range(x.shape[0]):
        for k, j in enumerate(range(offs, offs + n_dims, 2)):
            c, s = math.cos(p * 10000.0 ** (-2 * k / n_dims)), math.sin(p * 10000.0 ** (-2 * k / n_dims))
            a, b = x[p, :, j].astype(np.float64), x[p, :, j + 1].astype(np.float64)
            y[p, :, j], y[p, :, j + 1] = c * a - s * b, s * a + c * b
    return y


def _rope_node(ctx, x, n_dims=4, mode=0):
    """rope of x (numpy (positions, heads, ne0)) at positions 0, 1, ..."""
    return pyggml.rope(ctx, ctx.from_numpy(x), ctx.from_numpy(np.arange(x.shape[0], dtype=np.int32)), n_dims, mode)


HAVE_ROPE_OFFSET = _rope_offset_available()
needs_rope_offset = pytest.mark.skipif(not HAVE_ROPE_OFFSET, reason="this ggml has no ggml_rope_set_offset")


def test_rope_set_offset_needs_a_ggml_that_has_it():
    if HAVE_ROPE_OFFSET:
        pytest.skip("this ggml has ggml_rope_set_offset")
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.GGMLVersionError, match="rope_set_offset"):
            pyggml.rope_set_offset(_rope_node(ctx, np.zeros((1, 3, 8), np.float32)), 2)


@needs_rope_offset
@pytest.mark.parametrize("offs", [0, 2, 4])
def test_rope_with_an_offset_rotates_that_block(offs):
    x = np.random.default_rng(offs).standard_normal((3, 2, 8)).astype(np.float32)
    with pyggml.Context(1 << 20) as ctx:
        r = pyggml.rope_set_offset(_rope_node(ctx, x), offs)
        assert r.op_params[15] == offs
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(r)
        g.compute(1)
        np.testing.assert_allclose(r.numpy(), _rotated(x, offs, 4), atol=1e-5)


@needs_rope_offset
def test_rope_set_offset_refuses_what_ggml_asserts():
    x = np.zeros((3, 1, 8), np.float32)
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.ArgumentError, match="ROPE or ROPE_BACK node, not ADD"):
            pyggml.rope_set_offset(pyggml.add(ctx, ctx.from_numpy(x), ctx.from_numpy(x)), 2)
        with pytest.raises(pyggml.ArgumentError, match="n_offs must be >= 0"):
            pyggml.rope_set_offset(_rope_node(ctx, x), -2)
        # VISION: n_dims = ne0 / 2 and 4 sections
        v = pyggml.rope_multi(ctx, ctx.from_numpy(np.zeros((1, 3, 8), np.float32)),
                              ctx.from_numpy(np.zeros(4, np.int32)), None, 4, [2, 2, 0, 0], A.ROPE_VISION, *A._PLAIN)
        with pytest.raises(pyggml.ArgumentError, match="VISION"):
            pyggml.rope_set_offset(v, 2)


@needs_rope_offset
@pytest.mark.parametrize("offs", [1, 6])
def test_rope_set_offset_refuses_what_the_kernel_asserts_and_leaves_the_node(offs):
    # odd, or a block of 4 from 6 that ends past the row of 8: the kernel GGML_ASSERTs both
    x = np.zeros((3, 1, 8), np.float32)
    with pyggml.Context(1 << 20) as ctx:
        r = _rope_node(ctx, x)
        with pytest.raises(pyggml.KernelPreconditionError, match=r"offset .*must be even, with offset \+ n_dims"):
            pyggml.rope_set_offset(r, offs)
        assert r.op_params[15] == 0


@needs_rope_offset
def test_the_gradient_through_a_rope_with_an_offset_is_an_upstream_defect():
    from pyggml import defects
    x = np.random.default_rng(0).standard_normal((3, 1, 8)).astype(np.float32)
    with pyggml.Context(1 << 22) as ctx:
        a = ctx.from_numpy(x)
        pyggml.set_param(a)
        r = pyggml.rope_set_offset(pyggml.rope(ctx, a, ctx.from_numpy(np.arange(3, dtype=np.int32)), 4, 0), 2)
        loss = pyggml.sum(ctx, r)
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 64, grads=True)
        g.build_forward_expand(loss)
        with pytest.raises(pyggml.UpstreamDefect, match="ROPE_BACK without the offset") as e:
            g.build_backward_expand()
        assert e.value.defect == "rope-offset-grad"
    # rules off, ggml's gradient is measured wrong (the probe: against the exact one)
    assert defects.get("rope-offset-grad").run_probe() > 0.1
