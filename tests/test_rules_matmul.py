"""Both sides of the kernel rules of the [matmul] family (pyggml/csrc/rules_matmul.c).

For every refusal clause: pyggml refuses the node at the op call with the right class,
and the same node with the rules off makes the CPU kernel fail: it aborts, or reads or
writes out of bounds (the guarded proof, harness.kernel_verdict). The accepted side is the OpInfo samples
(tests/test_opinfo.py).

Also here: evidence for the upstream discrepancy of mul_mat's gradient (see the module's end).
"""

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import Arg, Sample, registry
from pyggml.opinfo.harness import grad_check, rules_disabled
from rules_helpers import BF16, F16, KPE, TYPE_ERR, refused_and_kernel_fails, rnd, t_, tr, untrusted


# --- refusals the kernel backs with an abort or an out-of-bounds access ---------------------

def _mmid(as_type=Type.F32, b_type=Type.F32, as_layout=None, b_layout=None):
    def build(ctx):
        K = 32 if as_type.is_quantized else 4
        if as_layout == "permuted":     # [K, M, E] with rows not contiguous, yet not "transposed" (nb0 <= nb1)
            a = pyggml.permute(ctx, t_(ctx, rnd((3, K, 4)), as_type), 2, 0, 1, 3)
        else:
            a = t_(ctx, rnd((4, 3, K)), as_type)
        b = tr(ctx, rnd((2, 2, K)), b_type) if b_layout == "transposed" else t_(ctx, rnd((2, 2, K)), b_type)
        ids = t_(ctx, [[0, 3], [1, 1]], Type.I32)
        return pyggml.mul_mat_id(ctx, a, b, ids)
    return build


def _out_prod(a_type=Type.F32, b_type=Type.F32, a_shape=(3, 4, 8), b_shape=(3, 4, 5), a_layout=None):
    def build(ctx):
        if a_layout == "permuted":      # [8, 4, 3] with rows not contiguous, yet not "transposed"
            a = pyggml.permute(ctx, t_(ctx, rnd((4, 8, 3)), a_type), 2, 0, 1, 3)
        else:
            a = t_(ctx, rnd(a_shape), a_type)
        return pyggml.out_prod(ctx, a, t_(ctx, rnd(b_shape), b_type))
    return build


CASES = [
    # name, build, exception, message, defect id
    # MUL_MAT_ID (ggml-cpu.c ggml_compute_forward_mul_mat_id)
    ("mul_mat_id: experts without a CPU dot", _mmid(as_type=Type.I32), TYPE_ERR, "no dot product for the experts", ""),
    ("mul_mat_id: b neither F32 nor the vec_dot type", _mmid(as_type=F16, b_type=BF16), TYPE_ERR,
     "src1 must be F32 or f16", ""),
    ("mul_mat_id: experts' rows not contiguous", _mmid(as_layout="permuted"), KPE,
     "src0 must have contiguous rows", ""),
    ("mul_mat_id: b's rows not contiguous", _mmid(b_layout="transposed"), KPE, "src1 must have contiguous rows", ""),
    # OUT_PROD (ops.cpp ggml_compute_forward_out_prod)
    ("out_prod: BF16 a", _out_prod(a_type=BF16), TYPE_ERR, "does not take src0 of type bf16", ""),
    ("out_prod: F32 a, F16 b", _out_prod(b_type=F16), TYPE_ERR, "src1 must be F32", ""),
    ("out_prod: Q8_0 a, F16 b", _out_prod(a_type=Type.Q8_0, b_type=F16, a_shape=(3, 4, 32), b_shape=(3, 4, 8)),
     TYPE_ERR, "src1 must be F32", ""),
    ("out_prod: a's rows not contiguous", _out_prod(a_layout="permuted"), KPE, "src0 must have contiguous rows", ""),
    ("out_prod: F16 a broadcast", _out_prod(a_type=F16, a_shape=(1, 4, 8)), KPE, "cannot be broadcast", ""),
    ("out_prod: Q8_0 a broadcast", _out_prod(a_type=Type.Q8_0, a_shape=(1, 4, 32)), KPE, "cannot be broadcast", ""),
]


@pytest.mark.parametrize("name, build, exc, match, defect", CASES, ids=[c[0] for c in CASES])
def test_rule_refuses_what_the_kernel_fails_on(name, build, exc, match, defect):
    refused_and_kernel_fails(build, exc, match, defect)


# --- upstream discrepancies ------------------------------------------------------------------

@pytest.mark.parametrize("ash, bsh", [((1, 2, 3, 4), (2, 4, 2, 4)), ((2, 1, 3, 4), (2, 2, 2, 4)),
                                      ((1, 1, 3, 4), (2, 1, 2, 4))])
def test_upstream_mul_mat_backward_aborts_for_a_broadcast_a_and_a_4d_b(ash, bsh):
    # ggml.c ggml_compute_backward, case GGML_OP_MUL_MAT: GGML_ASSERT(tmp->ne[3] == 1)
    # when src0 is broadcast and src1 has ne3 > 1 (defect "mul-mat-broadcast-grad"): refused
    # by build_backward_expand; with pyggml's checks off, ggml aborts
    info = registry()["mul_mat"]
    s = Sample((Arg(rnd(ash).astype(np.float64)), Arg(rnd(bsh, 1).astype(np.float64))))
    with pytest.raises(pyggml.UpstreamDefect, match="asserts b's ne.3. == 1") as e:
        grad_check(info, s)
    assert e.value.defect == "mul-mat-broadcast-grad"
    with rules_disabled(), pytest.raises(pyggml.GGMLAbort, match=r"tmp->ne\[3\] == 1"):
        grad_check(info, s)


# --- ggml 0.25.3's tiled K-quant path: a Q8_K src1 with unpacked batches (mul-mat-tiled-q8k-batches)

def _tiled_q8k(op):
    """mul_mat (or mul_mat_id, every token to expert 0) of Q4_K weights by a Q8_K src1 whose 2
    batches of 8 rows (mul_mat_id: 8 tokens of 1 row) are followed by rows they do not hold;
    returns (build, want): want is the float64 product of the values the blocks hold"""
    from pyggml._defect_probes import q8_k_rows
    from pyggml.opinfo.harness import read
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 16, 256)).astype(np.float32)
    raw, xv = q8_k_rows(rng.standard_normal((8, 2, 256) if op == "mul_mat_id" else (2, 16, 256)).astype(np.float32))
    seen = {}

    def build(ctx):
        store = ctx.from_numpy(raw, type=Type.Q8_K)
        if op == "mul_mat_id":
            a = ctx.from_numpy(pyggml.quantize(Type.Q4_K, w.reshape(-1, 256)).reshape(2, 16, -1), type=Type.Q4_K)
            seen["w"] = read(a)[0]
            b = pyggml.view_3d(ctx, store, 256, 1, 8, store.nb[1], store.nb[2], 0)     # token t: row 2t
            return pyggml.mul_mat_id(ctx, a, b, ctx.from_numpy(np.zeros((8, 1), np.int32)))
        a = ctx.from_numpy(pyggml.quantize(Type.Q4_K, w[0]), type=Type.Q4_K)
        seen["w"] = read(a)
        b = pyggml.view_3d(ctx, store, 256, 8, 2, store.nb[1], store.nb[2], 0)         # rows 0..7 of each batch
        return pyggml.mul_mat(ctx, a, b)

    def want():
        x = xv[:, 0, :] if op == "mul_mat_id" else xv[:, :8, :]
        return np.einsum("mk,...k->...m", seen["w"], x.astype(np.float64))
    return build, want


@pytest.mark.parametrize("op", ["mul_mat", "mul_mat_id"])
def test_a_q8_k_src1_with_unpacked_batches_is_refused_where_the_tiled_path_misreads_it(op):
    from pyggml import defects
    from pyggml.opinfo._common import kernel_since
    from rules_helpers import compute_unchecked, refused
    build, want = _tiled_q8k(op)
    kop = op.upper()
    if kernel_since(kop, "0.25.3"):
        refused(build, pyggml.UpstreamDefect, "tiled path reads row r", "mul-mat-tiled-q8k-batches")
        got = compute_unchecked(build)
        w = want()
        if defects.present("mul-mat-tiled-q8k-batches"):        # an AVX build: the wrong rows
            assert np.abs(got.reshape(w.shape) - w).max() > 0.5 * np.abs(w).max()
        return
    with pyggml.Context(16 << 20) as ctx:       # the stock path reads every batch at its nb[2]: right
        t = build(ctx)
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(t)
        g.compute(1)
        got = t.numpy().astype(np.float64)
    w = want()
    np.testing.assert_allclose(got.reshape(w.shape), w, rtol=1e-4, atol=1e-3 * np.abs(w).max())
    if not kernel_since(kop, "0.25.3") and kop not in pyggml._core.kernel_trust()["untrusted"]:
        was = pyggml._core._set_kernel_reviewed(getattr(pyggml.Op, kop), "0.25.3")   # the rule for 0.25.3's kernel
        try:
            refused(build, pyggml.UpstreamDefect, "tiled path reads row r", "mul-mat-tiled-q8k-batches")
        finally:
            pyggml._core._set_kernel_reviewed(getattr(pyggml.Op, kop), was)


def test_the_tiled_path_s_refusal_needs_8_rows():
    """fewer than 8 src1 rows take the stock path, which reads the batches right: not refused,
    even under a 0.25.3 review"""
    from pyggml._defect_probes import q8_k_rows
    raw, _ = q8_k_rows(np.zeros((2, 16, 256), np.float32))
    was_untrusted = pyggml._core._set_kernel_untrusted(pyggml.Op.MUL_MAT, False)   # (a prebuilt ggml trusts none)
    was = pyggml._core._set_kernel_reviewed(pyggml.Op.MUL_MAT, "0.25.3")
    try:
        with pyggml.Context(16 << 20) as ctx:
            a = ctx.from_numpy(pyggml.quantize(Type.Q4_K, np.ones((16, 256), np.float32)), type=Type.Q4_K)
            store = ctx.from_numpy(raw, type=Type.Q8_K)
            pyggml.mul_mat(ctx, a, pyggml.view_3d(ctx, store, 256, 7, 2, store.nb[1], store.nb[2], 0))
            with pytest.raises(pyggml.UpstreamDefect, match="tiled path"):
                pyggml.mul_mat(ctx, a, pyggml.view_3d(ctx, store, 256, 8, 2, store.nb[1], store.nb[2], 0))
            pyggml.mul_mat(ctx, a, pyggml.view_3d(ctx, store, 256, 8, 2, store.nb[1], 8 * store.nb[1], 0))  # packed
    finally:
        pyggml._core._set_kernel_reviewed(pyggml.Op.MUL_MAT, was)
        pyggml._core._set_kernel_untrusted(pyggml.Op.MUL_MAT, was_untrusted)


# --- the precision API of ggml after 0.20.2 (ggml_prec_set_acc, ggml_prec_set_src) ----------------

def test_the_precision_api_sets_what_ggml_says_and_the_cpu_computes_the_same():
    from pyggml import _optable
    a, b = rnd((3, 8)).astype(np.float32), rnd((4, 8), 1).astype(np.float32)
    with pyggml.Context(1 << 20) as ctx:
        r = pyggml.mul_mat(ctx, ctx.from_numpy(a), ctx.from_numpy(b))
        if "ggml_prec_set_acc" not in _optable.API:         # the linked ggml.h's GGML_API functions
            for call in (lambda: pyggml.prec_set_acc(r, pyggml.Prec.F32),
                         lambda: pyggml.prec_set_src(r, pyggml.Prec.F32, 1)):
                with pytest.raises(pyggml.GGMLVersionError, match="newer than this ggml"):
                    call()
            return
        P = pyggml.Prec
        assert pyggml.prec_set_acc(r, P.F32) is True and r.op_params[0] == int(P.F32)
        assert pyggml.prec_set_src(r, P.BF16, 1) is True and r.op_params[3] == int(P.BF16)
        assert pyggml.prec_set_src(r, P.F16, 0) is False and r.op_params[2] == 0     # src1 only
        assert r.op_params[1] == 0                          # the hint (Hadamard) untouched
        s = pyggml.add(ctx, ctx.from_numpy(a), ctx.from_numpy(a))
        assert pyggml.prec_set_acc(s, P.F32) is False and list(s.op_params[:4]) == [0, 0, 0, 0]
        with pytest.raises(pyggml.ArgumentError, match=r"idx must be in \[0, 10\)"):
            pyggml.prec_set_src(r, P.F32, 10)
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(r)
        g.compute(1)
        np.testing.assert_allclose(r.numpy(), b.astype(np.float64) @ a.T.astype(np.float64), rtol=1e-5, atol=1e-5)


# --- the Hadamard hint (ggml_mul_mat_set_hint: ops.cpp ggml_compute_forward_fwht) ------------------

def _hadamard(n):
    """the normalized Sylvester Hadamard matrix H_n / sqrt(n), float64"""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def _hinted(src0, src1_shape=(3, 16), src1_type=Type.F32, seed=5, src0_type=Type.F32):
    """mul_mat(src0, x) with the Hadamard hint set (src0: float64 values, numpy order)"""
    def build(ctx):
        r = pyggml.mul_mat(ctx, t_(ctx, src0, src0_type), t_(ctx, rnd(src1_shape, seed), src1_type))
        pyggml.mul_mat_set_hint(r, pyggml.OpHint.SRC0_IS_HADAMARD)
        return r
    return build


def _have_hint():
    from pyggml import _optable
    return "ggml_mul_mat_set_hint" in _optable.API        # the linked ggml.h's GGML_API functions


def test_the_hadamard_hint_computes_the_transform_without_reading_src0():
    if not _have_hint():
        with pyggml.Context(1 << 20) as ctx:
            r = pyggml.mul_mat(ctx, t_(ctx, rnd((4, 4))), t_(ctx, rnd((2, 4))))
            with pytest.raises(pyggml.GGMLVersionError, match="newer than this ggml"):
                pyggml.mul_mat_set_hint(r, 1)
        return
    from rules_helpers import computed
    H, x = _hadamard(16), rnd((3, 16), 5).astype(np.float64)
    with pyggml.Context(1 << 20) as ctx:
        r = _hinted(H)(ctx)
        assert r.op_params[1] == int(pyggml.OpHint.SRC0_IS_HADAMARD) == 1
        np.testing.assert_allclose(computed(ctx, r), x @ H.T, rtol=1e-5, atol=1e-5)
        # the kernel never reads src0: a zero src0 gives the same transform (the caller's promise)
        z = _hinted(np.zeros((16, 16)))(ctx)
        np.testing.assert_allclose(computed(ctx, z), x @ H.T, rtol=1e-5, atol=1e-5)
        plain = pyggml.mul_mat(ctx, t_(ctx, np.zeros((16, 16))), t_(ctx, x))
        pyggml.mul_mat_set_hint(plain, pyggml.OpHint.NONE)
        assert not computed(ctx, plain).any()              # no hint: the product, zero
        with pytest.raises(pyggml.ArgumentError, match="must be a MUL_MAT node, not ADD"):
            pyggml.mul_mat_set_hint(pyggml.add(ctx, t_(ctx, x), t_(ctx, x)), 1)
        with pytest.raises(pyggml.ArgumentError, match="hint"):
            pyggml.mul_mat_set_hint(r, 7)


@pytest.mark.parametrize("src0, src1_shape, exc, match", [
    (np.eye(12), (3, 12), KPE, "ne10 = 12 to be a power of 2"),
    (np.ones((8, 16)), (3, 16), KPE, r"src0 must be square: .* ne01 = 8 \(past its end\)"),
    (np.ones((32, 16)), (3, 16), KPE, r"ne01 = 32 \(leaving the rest unwritten\)"),
])
def test_the_hadamard_hint_is_refused_where_the_kernel_aborts_or_writes_past(src0, src1_shape, exc, match):
    if not _have_hint():
        pytest.skip("this ggml has no ggml_mul_mat_set_hint")
    build = _hinted(src0, src1_shape)
    if "power of 2" in match and untrusted("MUL_MAT"):
        # a refusal standing for the kernel's abort (pg_kernel_aborts): where the kernel is not
        # one the rule holds for (a prebuilt ggml), the hint is set and the graph's proof sees
        # the abort at compute
        with pyggml.Context(1 << 20) as ctx:
            g = pyggml.Graph(ctx, 8)
            g.build_forward_expand(build(ctx))
            with pytest.raises(pyggml.GGMLAbort, match=r"would abort .*GGML_ASSERT\(\(n & \(n - 1\)\) == 0\)"):
                g.compute(1)
        return
    with pyggml.Context(1 << 20) as ctx:
        r = pyggml.mul_mat(ctx, t_(ctx, src0), t_(ctx, rnd(src1_shape, 5)))
        with pytest.raises(exc, match=match):
            pyggml.mul_mat_set_hint(r, pyggml.OpHint.SRC0_IS_HADAMARD)
        assert r.op_params[1] == 0                          # refused: the node as it was
    from pyggml.opinfo.harness import kernel_verdict
    from pyggml.opinfo._common import kernel_release
    if kernel_release("MUL_MAT") is not None:           # the kernel the rule holds for
        # ne01 > n leaves elements unwritten: nothing out of bounds, silently wrong ("ok")
        want = {"abort"} if "power of 2" in match else {"out-of-bounds"} if "past its end" in match else {"ok"}
        assert kernel_verdict(build) in want


def test_the_hadamard_hint_takes_f16_rows_from_0_25_3():
    if not _have_hint():
        pytest.skip("this ggml has no ggml_mul_mat_set_hint")
    from pyggml.opinfo._common import kernel_before, kernel_since
    from rules_helpers import computed
    H = _hadamard(8)
    # an F16 src0: its vec_dot type is F16, so the product takes the F16 src1 on every release
    # and only the Hadamard path's own type switch decides
    build = _hinted(np.eye(8) @ H, (2, 8), Type.F16, src0_type=Type.F16)
    if kernel_since("MUL_MAT", "0.25.3"):
        with pyggml.Context(1 << 20) as ctx:
            x = rnd((2, 8), 5).astype(np.float16).astype(np.float64)
            np.testing.assert_allclose(computed(ctx, build(ctx)), x @ H.T, rtol=1e-5, atol=1e-5)
    elif kernel_before("MUL_MAT", "0.25.3"):
        refused_and_kernel_fails(build, pyggml.GGMLTypeError, "takes src1 F32 only, got f16", None)
    if untrusted("MUL_MAT"):        # these refusals stand for aborts: the proof decides there
        return
    for bad in (Type.BF16, Type.Q8_0):
        with pyggml.Context(1 << 20) as ctx:
            with pytest.raises(pyggml.GGMLTypeError):
                _hinted(np.eye(32), (2, 32), bad)(ctx)
