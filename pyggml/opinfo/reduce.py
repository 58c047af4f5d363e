"""OpInfos of the [reduce] family: sum, sum_rows, cumsum, mean, argmax, count_equal,
argsort, argsort_top_k, top_k.

Shapes are numpy order: the last numpy axis is ggml's ne[0], the axis these ops reduce,
scan or sort along. Samples that order values (argmax, argsort, top_k) draw every row
from distinct values (a shuffled grid plus jitter smaller than its step), so the expected
indices are unambiguous whatever the seed.

Not sampled: empty tensors (pyggml computes no graph holding a tensor without data).
"""

from __future__ import annotations

import numpy as np

from pyggml._core import SortOrder, Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import FLOATS, normal

# odd, unit and 4-D shapes (numpy order)
_SHAPES = [(7,), (3, 5), (2, 1, 4), (2, 3, 1, 5), (1, 1), (3, 2, 2, 3)]


def _layouts(rng, t, gen, shapes=_SHAPES, strided=True, permuted=True, transposed=False):
    """One-tensor samples: contiguous; strided rows (row stride twice the row); permuted
    with ne[0] kept in place (rows stay contiguous: dims 1 and 2 swapped); transposed (rows
    not contiguous) where the kernel takes any stride."""
    for shape in shapes:
        yield Sample((Arg(gen(rng, shape), t),), f"contiguous {shape}")
        if strided and len(shape) >= 2:
            yield Sample((Arg(gen(rng, shape), t, "strided"),), f"strided rows {shape}")
        if permuted and len(shape) >= 3:
            shape4 = (1,) * (4 - len(shape)) + shape
            yield Sample((Arg(gen(rng, shape4), t, "permuted", (0, 2, 1, 3)),), f"dims 1, 2 swapped {shape4}")
        if transposed and len(shape) >= 2:
            yield Sample((Arg(gen(rng, shape), t, "transposed"),), f"transposed {shape}")


def distinct(rng: np.random.Generator, shape, step: float = 0.25) -> np.ndarray:
    """Values with no ties along the last axis, exactly representable gaps in F32: each
    row a shuffled grid of ``step`` (centred on 0) plus a common jitter < step/4."""
    shape = tuple(shape)
    n = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    grid = (np.arange(n) - (n - 1) / 2) * step
    out = np.stack([rng.permutation(grid) for _ in range(rows)]).reshape(shape)
    return out + rng.uniform(0, step / 4)


def _positive(rng, shape):
    """Normal values around 1 (a sum far from 0: the tolerance of a rounded F16/BF16
    result is relative to it)."""
    return normal(rng, shape, 0.5) + 1.0


# --- sum, sum_rows, mean, cumsum -----------------------------------------------------------

def _sum_samples(rng, t):
    yield from _layouts(rng, t, _positive)
    yield Sample((Arg(_positive(rng, (4, 33)), t),), "long rows (4, 33)")


def _rows_samples(rng, t):
    yield from _layouts(rng, t, normal)


def _ref_sum(a):
    return np.array([a.sum()])


# --- argmax ----------------------------------------------------------------------------------

def _argmax_samples(rng, t):
    for shape in ((7,), (1, 1), (3, 5), (4, 9), (1, 17)):
        yield Sample((Arg(distinct(rng, shape), t),), f"contiguous {shape}")
    yield Sample((Arg(distinct(rng, (5, 6)), t, "strided"),), "strided rows (5, 6)")
    yield Sample((Arg(distinct(rng, (3, 4)) - 10.0, t),), "all negative (3, 4)")


def _ref_argmax(a):
    a = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    return np.argmax(a, axis=-1).astype(np.int32)


# --- count_equal -----------------------------------------------------------------------------

def _pair(rng, shape, p_equal=0.4):
    a = rng.integers(-3, 4, size=shape).astype(np.int32)
    b = np.where(rng.random(shape) < p_equal, a, a + rng.integers(1, 3, size=shape)).astype(np.int32)
    return a, b


def _count_equal_samples(rng, t):
    # shapes (numpy order) where the kernel's row index is right: ggml ne03 in {1, ne01*ne02}
    # and ne02 in {1, ne01} (ops.cpp count_equal_i32)
    for shape in ((9,), (1, 1), (4, 7), (6, 5), (2, 2, 3), (4, 2, 2, 3), (3, 1, 3, 5), (1, 1, 6, 5)):
        a, b = _pair(rng, shape)
        yield Sample((Arg(a, Type.I32), Arg(b, Type.I32)), f"{shape}")
    a, b = _pair(rng, (4, 6))
    yield Sample((Arg(a, Type.I32, "transposed"), Arg(b, Type.I32)), "a transposed (4, 6)")
    yield Sample((Arg(a, Type.I32), Arg(b, Type.I32, "strided")), "b strided rows (4, 6)")
    yield Sample((Arg(a, Type.I32), Arg(a.copy(), Type.I32)), "all equal (4, 6)")
    # the kernel's row index goes wrong in 3-D and 4-D otherwise
    for shape in ((3, 2, 4), (2, 3, 2, 4), (2, 1, 4), (3, 5, 2)):
        a, b = _pair(rng, shape)
        yield Sample((Arg(a, Type.I32), Arg(b, Type.I32)), f"{shape}", defect="count-equal-row-index")


def _ref_count_equal(a, b):
    return np.array([np.count_nonzero(a == b)], dtype=np.int64)


# --- argsort, argsort_top_k, top_k --------------------------------------------------------

_SORT_SHAPES = [(7,), (1, 1), (3, 5), (2, 1, 9), (2, 3, 1, 6), (1, 33)]


def _sort_inputs(rng, t):
    """(Arg, name): distinct rows, contiguous, strided rows (packed: the kernel steps rows
    with nb[1] only), and a permutation of unit dims that keeps rows packed."""
    for shape in _SORT_SHAPES:
        yield Arg(distinct(rng, shape), t), f"{shape}"
    yield Arg(distinct(rng, (3, 2, 5)), t, "strided"), "strided rows (3, 2, 5)"
    yield Arg(distinct(rng, (2, 1, 3, 4)), t, "permuted", (0, 1, 3, 2)), "permuted unit dim (2, 1, 3, 4)"


def _argsort_samples(rng, t):
    for arg, name in _sort_inputs(rng, t):
        for order in (SortOrder.ASC, SortOrder.DESC):
            yield Sample((arg, order), f"{name} {order.name}")


def _ref_argsort(a, order):
    idx = np.argsort(a, axis=-1, kind="stable")
    return (idx if SortOrder(order) == SortOrder.ASC else idx[..., ::-1]).astype(np.int32)


def _top_k_samples(rng, t):
    for arg, name in _sort_inputs(rng, t):
        n = arg.value.shape[-1]
        for k in sorted({0 if n > 1 else 1, 1, min(2, n), min(3, n), n}):
            if k == 0:
                continue            # an empty result: nothing to compute
            yield Sample((arg, k), f"{name} k={k}")


def _ref_argsort_top_k(a, k):
    return np.argsort(a, axis=-1, kind="stable")[..., ::-1][..., :k].astype(np.int32)


def _ref_top_k(a, k):
    """The indices of the k largest of each row. ggml calls their order unspecified; its
    CPU kernel gives them in descending order of value and then swaps the first two (ops.cpp
    ggml_compute_forward_top_k_f32: "emphasize that the order is not important"), and this
    reference spells out that order; what is compared is each row's set (the OpInfo's
    canon), which is what ggml promises."""
    idx = _ref_argsort_top_k(a, k)
    if k > 1:
        idx[..., [0, 1]] = idx[..., [1, 0]]
    return idx


OPINFOS = [
    OpInfo("sum", ref=_ref_sum, samples=_sum_samples, types=FLOATS, grad=True,
           note="F16/BF16: the one-element result is of src0's type, so the default per-type "
                "bounds (the result's own rounding) apply"),
    OpInfo("sum_rows", ref=lambda a: a.sum(axis=-1, keepdims=True), samples=_rows_samples, grad=True),
    OpInfo("cumsum", ref=lambda a: np.cumsum(a, axis=-1), samples=_rows_samples),
    OpInfo("mean", ref=lambda a: a.mean(axis=-1, keepdims=True), samples=_rows_samples, grad=True),
    OpInfo("argmax", ref=_ref_argmax, samples=_argmax_samples, exact=True,
           note="ties not sampled: the CPU kernel returns the last index of a tied maximum, numpy the first"),
    OpInfo("count_equal", ref=_ref_count_equal, samples=_count_equal_samples, types=(Type.I32,), exact=True),
    OpInfo("argsort", ref=_ref_argsort, samples=_argsort_samples, exact=True,
           note="ties not sampled (std::sort is not stable)"),
    OpInfo("argsort_top_k", ref=_ref_argsort_top_k, samples=_top_k_samples, exact=True),
    OpInfo("top_k", ref=_ref_top_k, samples=_top_k_samples, exact=True, canon=lambda idx: np.sort(idx, axis=-1),
           note="ggml leaves the order of each row's k indices unspecified: the sets are compared (canon), "
                "as 0.9.4's ARGSORT view orders them otherwise"),
]
