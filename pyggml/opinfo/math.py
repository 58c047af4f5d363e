"""OpInfos of the [math] family: sqr, sqrt, log, sin, cos and the parameterless
elementwise UNARY ops (abs sgn neg step exp expm1 softplus floor ceil round trunc), each
with its _inplace variant.

All of them run unary-ops.cpp's unary_op template on the CPU: F32, F16 and BF16, rows
contiguous (nb[0] the element size, also for rows of one element), any strides over
dims 1..3. The samples here (:func:`elementwise_samples`, shared with the activation
family) keep rows contiguous: odd, unit and 4-D shapes, rows of a wider tensor
(``strided``) and dims 1..3 permuted. Empty tensors are left out: pyggml does not compute
a graph with tensors that have no data.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import FLOATS, away_from, normal, uniform

__all__ = ["OPINFOS", "elementwise_samples", "elementwise_info"]

Gen = Callable[[np.random.Generator, tuple], np.ndarray]


def elementwise_samples(rng: np.random.Generator, t: Type, gen: Gen, *, permuted: bool = True,
                        column: bool = False, extra: Iterable[np.ndarray] = ()) -> Iterable[Sample]:
    """One-tensor samples with contiguous rows, values from ``gen(rng, shape)``.

    The first three are contiguous (the gradient check takes them). ``permuted``: dims
    1..3 permuted (rows stay contiguous: the builders of UNARY ops assert it).
    ``column``: a transposed column (ne0 = 1, nb[0] = 4 rows' bytes): ggml_is_contiguous_rows
    lets it through the builder, the unary_op template aborts on it (nb[0] != element size),
    kernels that read a row of one element at its address take it. ``extra``: more values
    (e.g. the edge points of a domain), as contiguous tensors."""
    for shape in [(7,), (3, 5), (2, 1, 4), (2, 3, 1, 5), (1, 1)]:
        yield Sample((Arg(gen(rng, shape), t),), f"contiguous {shape}")
    yield Sample((Arg(gen(rng, (3, 5)), t, "strided"),), "strided rows (3, 5)")
    yield Sample((Arg(gen(rng, (2, 3, 4)), t, "strided"),), "strided rows (2, 3, 4)")
    if permuted:
        yield Sample((Arg(gen(rng, (2, 3, 4, 5)), t, "permuted", (0, 2, 1, 3)),), "dims 1, 2 swapped (2, 3, 4, 5)")
        yield Sample((Arg(gen(rng, (3, 2, 1, 6)), t, "permuted", (0, 3, 2, 1)),), "dims 1, 3 swapped (3, 2, 1, 6)")
    if column:
        yield Sample((Arg(gen(rng, (4, 1)), t, "transposed"),), "transposed column (ne0 = 1, nb[0] = 16)")
    for i, v in enumerate(extra):
        yield Sample((Arg(np.asarray(v, np.float64), t),), f"edge values {i}")


def elementwise_info(name: str, ref: Callable, gen: Gen, types=FLOATS, *, permuted: bool = True,
                     column: bool = False, extra: Iterable[np.ndarray] = (), **kw) -> OpInfo:
    extra = tuple(extra)

    def samples(rng, t):
        return elementwise_samples(rng, t, gen, permuted=permuted, column=column, extra=extra)
    return OpInfo(name, ref=ref, samples=samples, types=types, **kw)


# --- value generators ---------------------------------------------------------------------

def scaled(scale: float) -> Gen:
    return lambda rng, shape: normal(rng, shape, scale)


def positive(low: float, high: float) -> Gen:
    return lambda rng, shape: uniform(rng, shape, low, high)


def kinked(*points: float, scale: float = 2.0, margin: float = 0.1) -> Gen:
    """Normal values kept away from the kinks (gradient samples)."""
    return lambda rng, shape: away_from(rng, shape, points, margin, scale)


def with_halves(rng: np.random.Generator, shape) -> np.ndarray:
    """Normal values (scale 4), a third of them replaced by exact halves k + 0.5 (where
    rounding modes differ), and some by exact integers."""
    x = normal(rng, shape, 4.0)
    pick = rng.random(shape)
    halves = rng.integers(-6, 6, shape) + 0.5
    x = np.where(pick < 1 / 3, halves, x)
    return np.where(pick > 0.85, np.round(x), x)


# --- references (float64, from the math of each op) ----------------------------------------

def _log(x):
    with np.errstate(divide="ignore"):
        return np.log(x)


def ref_round(x):
    """roundf: halves away from zero (numpy's round is to even)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def ref_softplus(x):
    """log(1 + e^x), exactly (ggml returns x itself for x > 20, e^-20 relatively off)."""
    return np.logaddexp(0.0, x)


def ref_step(x):
    return (x > 0).astype(np.float64)


_EXPM1_NOTE = ("EXPM1 is computed as expf(x) - 1 (unary-ops.cpp op_expm1), which loses relative precision "
               "for |x| << 1 (NMSE 2.5e-5 for |x| < 1e-5, 0.26 for |x| < 1e-7, where expm1f is exact): the "
               "samples are N(0, 1)")
_SOFTPLUS_NOTE = ("SOFTPLUS is computed as logf(1 + expf(x)) (unary-ops.cpp op_softplus): for x < -17 it "
                  "returns 0 where log1p(e^x) ~ e^x (NMSE 3e-7 around x = -10, 1.0 below -20): the samples "
                  "are N(0, 3)")

_MATH = [
    # name, reference, values, grad (ggml_compute_backward has it), kwargs
    ("sqr", np.square, scaled(2.0), True, {}),
    ("sqrt", np.sqrt, positive(0.05, 6.0), True, {"extra": [[0.0, 1.0, 4.0, 0.25]]}),
    ("log", _log, positive(0.05, 6.0), True, {"extra": [[0.0, 1.0, np.e, 1e-3]]}),
    ("sin", np.sin, scaled(3.0), True, {}),
    ("cos", np.cos, scaled(3.0), True, {}),
    ("expm1", np.expm1, scaled(1.0), True, {"note": _EXPM1_NOTE}),
    ("softplus", ref_softplus, scaled(3.0), True, {"note": _SOFTPLUS_NOTE}),
    ("abs", np.abs, kinked(0.0), True, {}),
    ("sgn", np.sign, kinked(0.0), True, {"extra": [[0.0, -0.0, 1.0, -2.0]]}),
    ("neg", np.negative, scaled(2.0), True, {}),
    ("step", ref_step, kinked(0.0), True, {"extra": [[0.0, -0.0, 1e-3, -1e-3]]}),
    ("exp", np.exp, scaled(2.0), True, {}),
    ("floor", np.floor, with_halves, False, {}),
    ("ceil", np.ceil, with_halves, False, {}),
    ("round", ref_round, with_halves, False, {}),
    ("trunc", np.trunc, with_halves, False, {}),
]


def _infos():
    for name, ref, gen, grad, kw in _MATH:
        yield elementwise_info(name, ref, gen, grad=grad, **kw)
        yield elementwise_info(f"{name}_inplace", ref, gen, **kw)


OPINFOS = list(_infos())
