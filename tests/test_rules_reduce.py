"""Both sides of the kernel rules of the [reduce] family (pyggml/csrc/rules_reduce.c).

For each refusal clause: pyggml raises the right class at the op call, and the same node
built with the rules off shows that the CPU kernel really fails on it (kernel_verdict:
"abort" or "out-of-bounds") or silently computes wrong values. The accepted side is the
op-information registry's samples (tests/test_opinfo.py).

Clauses no Python call can reach (the builder already refuses, or makes the node so that
the clause holds) are listed in UNREACHABLE with the reason.
"""

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import registry
from pyggml.opinfo.harness import kernel_verdict, rules_disabled, run
from pyggml.opinfo.reduce import distinct
from rules_helpers import (T, X, X16, compute as _compute, refused_at_call as _refused,
                          rules_off_values as _rules_off_values)

UNREACHABLE = {
    "SUM_ROWS, CUMSUM, ARGSORT, TOP_K, ...: result rows/shape/type": "the builders make the result "
    "(a new contiguous tensor) of the shape and type the kernel needs",
    "CUMSUM: src0 type": "ggml_cumsum asserts F32 (GGMLAbort at the builder)",
    "ARGMAX: a matrix": "ggml_argmax asserts ggml_is_matrix",
    "COUNT_EQUAL: one shape": "ggml_count_equal asserts ggml_are_same_shape",
    "ARGSORT: sort order": "the wrapper takes SortOrder members only (ArgumentError before ggml)",
}


# --- refused, and the kernel aborts or leaves its tensors ------------------------------------

CASES = [
    # (id, build, class, match, verdict)
    ("sum_rows f16", lambda c: pyggml.sum_rows(c, c.from_numpy(X16)),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("sum_rows transposed", lambda c: pyggml.sum_rows(c, T(c, c.from_numpy(X))),
     pyggml.KernelPreconditionError, "src0 must have contiguous rows", "abort"),
    ("cumsum transposed", lambda c: pyggml.cumsum(c, T(c, c.from_numpy(X))),
     pyggml.KernelPreconditionError, "src0 must have contiguous rows", "abort"),
    ("sum i32", lambda c: pyggml.sum(c, c.from_numpy(np.arange(6, dtype=np.int32))),
     pyggml.GGMLTypeError, "does not take src0 of type i32", "abort"),
    ("mean f16", lambda c: pyggml.mean(c, c.from_numpy(X16)),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("argmax f16", lambda c: pyggml.argmax(c, c.from_numpy(X16[0])),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("count_equal f32", lambda c: pyggml.count_equal(c, c.from_numpy(X), c.from_numpy(X)),
     pyggml.GGMLTypeError, "takes I32 src0 and src1", "abort"),
    ("count_equal 3-D, reads outside", lambda c: pyggml.count_equal(
        c, c.from_numpy(np.zeros((3, 5, 2), np.int32)), c.from_numpy(np.zeros((3, 5, 2), np.int32))),
     pyggml.UpstreamDefect, "row index is wrong", "out-of-bounds"),
    ("argsort f16", lambda c: pyggml.argsort(c, c.from_numpy(X16), pyggml.SortOrder.ASC),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("argsort rows not packed", lambda c: pyggml.argsort(
        c, pyggml.permute(c, c.from_numpy(X), 0, 2, 1, 3), pyggml.SortOrder.ASC),
     pyggml.KernelPreconditionError, "packed rows", "out-of-bounds"),
    ("top_k f16", lambda c: pyggml.top_k(c, c.from_numpy(X16), 2),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("top_k rows not packed", lambda c: pyggml.top_k(c, pyggml.permute(c, c.from_numpy(X), 0, 2, 1, 3), 2),
     pyggml.KernelPreconditionError, "packed rows", "out-of-bounds"),
]


@pytest.mark.parametrize("build, cls, match, verdict", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_and_the_kernel_fails(build, cls, match, verdict):
    _refused(build, cls, match)
    assert kernel_verdict(build) == verdict


# --- refused, and the kernel computes wrong values -------------------------------------------

def _transposed(c, x):
    """A tensor of x's values (numpy order) whose rows are not contiguous: the kernels
    that ignore nb[0] read row i as the contiguous floats from i*nb[1] = 4*i bytes."""
    return T(c, c.from_numpy(np.ascontiguousarray(x.T).astype(np.float32)))


def test_argmax_of_rows_not_contiguous():
    x = np.array([[0.0, 1, 2, 3, 9, 5], [9.0, 1, 2, 3, 4, 5], [0.0, 9, 2, 3, 4, 5], [0.0, 1, 2, 3, 9, 8]])
    build = lambda c: pyggml.argmax(c, _transposed(c, x))
    _refused(build, pyggml.KernelPreconditionError, "src0 must have contiguous rows")
    assert kernel_verdict(build) == "ok"                        # reads inside src0, but the wrong elements
    assert list(_rules_off_values(build)) != list(np.argmax(x, axis=1))


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_core_sum_mean_of_rows_not_contiguous(op):
    """rules_reduce.c SUM/MEAN: the kernels' asserts on nb[0] are compiled out; they sum the
    contiguous floats from each row's start."""
    x = np.arange(24.0).reshape(4, 6)
    build = lambda c: getattr(pyggml, op)(c, _transposed(c, x))
    _refused(build, pyggml.KernelPreconditionError, "src0 must have contiguous rows")
    assert kernel_verdict(build) == "ok"
    want = np.array([x.sum()]) if op == "sum" else x.mean(axis=-1)
    assert not np.allclose(_rules_off_values(build).ravel(), want)


# every row descending: argsort DESC is 0..5 and the top 2 are {0, 1} in each row
_DESC_ROWS = -10.0 * np.arange(6)[None, :] + np.arange(4)[:, None]


def test_argsort_of_rows_not_contiguous():
    build = lambda c: pyggml.argsort(c, _transposed(c, _DESC_ROWS), pyggml.SortOrder.DESC)
    _refused(build, pyggml.KernelPreconditionError, "src0 must have contiguous rows")
    assert kernel_verdict(build) == "ok"
    assert not np.array_equal(_rules_off_values(build), np.broadcast_to(np.arange(6), (4, 6)))


def test_top_k_of_rows_not_contiguous():
    build = lambda c: pyggml.top_k(c, _transposed(c, _DESC_ROWS), 2)
    _refused(build, pyggml.KernelPreconditionError, "src0 must have contiguous rows")
    assert kernel_verdict(build) == "ok"
    got = np.sort(_rules_off_values(build), axis=-1)
    assert not np.array_equal(got, np.broadcast_to([0, 1], (4, 2)))


def test_count_equal_row_index_defect_counts_wrong_rows():
    # ne (4, 2, 3): the kernel visits rows 0, 1, 1, 2, 2, 3 of 6; equal only in the last row
    a = np.zeros((3, 2, 4), np.int32)
    b = np.ones((3, 2, 4), np.int32)
    b[2, 1] = 0
    build = lambda c: pyggml.count_equal(c, c.from_numpy(a), c.from_numpy(b))
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.UpstreamDefect, match="row index is wrong") as e:
            build(ctx)
    assert e.value.defect == "count-equal-row-index"
    assert kernel_verdict(build) == "ok"
    assert int(_rules_off_values(build)[0]) == 0                  # 4 equal elements, counted 0
    assert int(_rules_off_values(build, n_threads=2)[0]) == 0


@pytest.mark.parametrize("shape", [(4, 7), (2, 2, 3), (4, 2, 2, 3), (3, 1, 3, 5), (1, 1, 6, 5)])
def test_count_equal_accepted_where_the_row_index_is_right(shape):
    a = np.random.default_rng(3).integers(0, 3, shape).astype(np.int32)
    b = np.random.default_rng(4).integers(0, 3, shape).astype(np.int32)
    with pyggml.Context(1 << 20) as ctx:
        for n in (1, 2):
            t = pyggml.count_equal(ctx, ctx.from_numpy(a), ctx.from_numpy(b))
            assert int(_compute(ctx, t, n)[0]) == int((a == b).sum())


def test_top_k_negative_k():
    """The builder asserts only k <= ne[0]: k < 0 makes a result of ne[0] = k, which the
    shape check every node passes refuses (before TOP_K's own rule, which refuses k < 0
    too), in a pool and a no_alloc context alike. The kernel side: with the rules off no
    context can hold the result (its size is negative), so no graph with it can compute."""
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.KernelPreconditionError, match=r"TOP_K result has ne\[0\] = -1: a dimension"):
            pyggml.top_k(ctx, ctx.from_numpy(X), -1)
    with pyggml.Context(1 << 16, no_alloc=True) as ctx:
        with pytest.raises(pyggml.KernelPreconditionError, match=r"TOP_K result has ne\[0\] = -1: a dimension"):
            pyggml.top_k(ctx, ctx.new_tensor(Type.F32, (5, 4, 3, 1)), -1)
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.ContextFullError):
            pyggml.top_k(ctx, ctx.from_numpy(X), -1)


# --- accepted: what the samples do not show --------------------------------------------------

def test_top_k_is_the_set_of_the_k_largest():
    """Order-free: whatever order the kernel gives, the indices are those of the k largest."""
    info = registry()["top_k"]
    for s in info.samples(np.random.default_rng(5), Type.F32):
        res = run(info, s)
        x = np.asarray(s.args[0].value)
        want = np.sort(np.argsort(x, axis=-1)[..., ::-1][..., :s.args[1]], axis=-1)
        assert np.array_equal(np.sort(res.out.reshape(want.shape), axis=-1), want), s.name


# group_norm ([norm]) is computed here too: one test item per thread count, kept whole
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_threads(n_threads):
    """Kernels that split rows (or groups) over threads, and TOP_K's per-thread work rows
    (ggml_graph_plan's padding covers the kernel's cache-line offsets), on more threads than rows."""
    x = distinct(np.random.default_rng(6), (2, 3, 40)).astype(np.float32)
    with pyggml.Context(16 << 20) as ctx:
        a = ctx.from_numpy(x)
        got = _compute(ctx, pyggml.top_k(ctx, a, 40), n_threads)
        assert np.array_equal(np.sort(got, -1), np.broadcast_to(np.arange(40), got.shape))
        got = _compute(ctx, pyggml.argsort(ctx, a, pyggml.SortOrder.ASC), n_threads)
        assert np.array_equal(got, np.argsort(x, axis=-1))
        got = _compute(ctx, pyggml.group_norm(ctx, a, 2, 1e-5), n_threads)
        want = registry()["group_norm"].ref(x.astype(np.float64), 2, 1e-5)
        assert np.max(np.abs(got - want)) < 1e-4
        ints = ctx.from_numpy((x > 0).astype(np.int32).reshape(6, 40))
        assert int(_compute(ctx, pyggml.count_equal(ctx, ints, ints), n_threads)[0]) == 240
