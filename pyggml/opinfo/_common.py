"""Sample generators and reference helpers shared by the families of pyggml.opinfo.

Shapes are numpy order (the reverse of ggml's ne). ggml broadcasts by tiling: b is
repeated to a's shape when each a.ne[i] is a multiple of b.ne[i] (``ggml_can_repeat``),
which is not numpy's broadcasting: :func:`tile_to` is the reference of it.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, Sample

FLOATS = (Type.F32, Type.F16, Type.BF16)


def normal(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * scale


def uniform(rng: np.random.Generator, shape, low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, shape)


def away_from(rng: np.random.Generator, shape, points=(0.0,), margin: float = 0.1, scale: float = 1.0):
    """Normal values kept ``margin`` away from ``points`` (kinks of abs, relu, step, ...),
    so central differences do not straddle them."""
    x = rng.standard_normal(shape) * scale
    for p in points:
        close = np.abs(x - p) < margin
        x[close] = p + np.where(x[close] >= p, margin, -margin) * 2
    return x


def tile_to(b: np.ndarray, shape) -> np.ndarray:
    """ggml_repeat of b to shape (numpy order): each dim tiled a whole number of times."""
    b = np.asarray(b)
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    reps = []
    for n, m in zip(shape, b.shape):
        if m == 0 or n % m:
            raise ValueError(f"cannot tile {b.shape} to {shape}")
        reps.append(n // m)
    return np.tile(b, reps)


def shapes_unary() -> list[tuple[int, ...]]:
    """Odd, unit and 4-D shapes (numpy order)."""
    return [(7,), (3, 5), (2, 1, 4), (2, 3, 1, 5), (1, 1)]


def unary_samples(rng: np.random.Generator, t: Type, gen=normal, layouts=("contiguous", "transposed", "permuted"),
                  shapes=None) -> Iterable[Sample]:
    """One-tensor samples over shapes and layouts."""
    for shape in shapes or shapes_unary():
        for layout in layouts:
            if layout != "contiguous" and len(shape) < 2:
                continue
            perm = (1, 0, 3, 2) if layout == "permuted" else (0, 1, 2, 3)
            if layout == "permuted" and len(shape) < 4:
                shape4 = (1,) * (4 - len(shape)) + shape
                yield Sample((Arg(gen(rng, shape4), t, layout, perm),), f"{layout} {shape4}")
                continue
            yield Sample((Arg(gen(rng, shape), t, layout, perm),), f"{layout} {shape}")


def broadcast_pairs() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(a, b) shapes (numpy order) where b tiles to a, ggml's rule."""
    return [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (1, 3, 4)), ((2, 3, 4), (2, 1, 4)), ((2, 3, 4), (1, 1, 4)),
            ((2, 3, 4), (2, 3, 1)), ((3, 6), (3, 2)), ((5,), (1,)), ((2, 2, 3, 5), (1, 2, 1, 5))]


def rope_ndims0_defect(op: str = "ROPE") -> str:
    """The defect a rope sample with n_dims = 0 (not VISION) meets in this build:
    "rope-ndims0-hang" where the op's kernel is not the one pyggml's rule was written against
    (kernel_trust(): ggml 0.25.3's hangs there, and a prebuilt ggml's is unknown), whose
    rule then refuses it; "" where the kernel is the pinned one (it copies the row)."""
    from pyggml._core import kernel_trust
    return "rope-ndims0-hang" if op in kernel_trust()["untrusted"] else ""
