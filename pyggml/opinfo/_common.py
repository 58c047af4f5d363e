"""Sample generators and reference helpers shared by the families of pyggml.opinfo.

Shapes are numpy order (the reverse of ggml's ne). ggml broadcasts by tiling: b is
repeated to a's shape when each a.ne[i] is a multiple of b.ne[i] (``ggml_can_repeat``),
which is not numpy's broadcasting: :func:`tile_to` is the reference of it.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from pyggml._core import Type
from pyggml.defects import release_key
from pyggml.opinfo import Arg, Sample

FLOATS = (Type.F32, Type.F16, Type.BF16)


def _readable(t: Type) -> bool:
    """Whether ggml can turn t back into floats (its type traits have a ``to_float``)."""
    from pyggml._core import dequantize
    from pyggml.errors import GGMLTypeError
    try:
        dequantize(t, np.zeros(t.type_size, np.uint8), (t.blck_size,))
    except GGMLTypeError:
        return False
    return True


# every quantized type of the linked ggml
# Rope modes (ggml.h's GGML_ROPE_TYPE_* #defines, pyggml.RopeType), written out once for the
# samples: an older ggml's header lacks some (IMROPE), and its samples still ask for them (to
# be refused: GGMLVersionError). tests/test_opinfo.py holds them against the linked header's.
ROPE_NORMAL, ROPE_NEOX, ROPE_MROPE, ROPE_VISION, ROPE_IMROPE = 0, 2, 8, 24, 40
ROPE_MODES = {"NORMAL": ROPE_NORMAL, "NEOX": ROPE_NEOX, "MROPE": ROPE_MROPE, "VISION": ROPE_VISION,
              "IMROPE": ROPE_IMROPE}

QUANTIZED = tuple(t for t in Type if t.is_quantized)
# the types ggml has only as the other side of a dot product (an F32 b converted for a's
# vec_dot): no to_float, so no reference can read a tensor of them (Q8_1, Q8_K)
DOT_ONLY = tuple(t for t in QUANTIZED if not _readable(t))
# the types whose first quantization in a process builds a search grid: measured 5.6 s
# (IQ2_S) and 12.3 s (IQ1_M) on a Zen 5; IQ2_XXS, IQ2_XS and IQ1_S also need an imatrix.
# Sampled by one dedicated test (tests/test_opinfo.py), not by every sweep.
SLOW_TO_QUANTIZE = tuple(getattr(Type, n) for n in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")
                         if hasattr(Type, n))


def quantized_but(*excluded: Type) -> tuple[Type, ...]:
    """QUANTIZED without the types named (and never the DOT_ONLY ones, which no sample can hold)."""
    return tuple(t for t in QUANTIZED if t not in excluded and t not in DOT_ONLY)


def unsampled(types: Iterable[Type], why: str, sampled: Iterable[Type] = ()) -> dict[Type, str]:
    """An OpInfo's ``unsampled``: each of ``types`` not in ``sampled``, with why no sample holds it."""
    sampled = tuple(sampled)
    return {t: why for t in types if t not in sampled}


SLOW_WHY = ("its quantization takes seconds to start: tests/test_opinfo.py samples it once for mul_mat, "
            "mul_mat_id, out_prod, get_rows and flash_attn_ext")
DOT_ONLY_WHY = "no to_float: no reference can read a tensor of it back"
# the arguments whose type no kernel reads
SHAPE_WHY = "the argument of this type gives a shape only: no kernel reads its data"
VIEW_WHY = "a view: no kernel runs (its bytes are the source's)"
BYTES_WHY = ("a same-type copy moves whole blocks as bytes, one code path for every block type: "
             "sampled for the block types in `types`")
CONVERT_WHY = ("into this type: ggml's CPU quantizer (from_float) has no exact reference here (the converted "
               "types in `types` are compared with ggml's own quantization, pyggml.quantize)")


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


def kernel_release(op: str) -> tuple[int, ...] | None:
    """The release op's trusted CPU kernel is from (a review's, else the pinned prints'), as
    csrc's kernel_release sees it; None for an untrusted kernel."""
    from pyggml._core import kernel_trust
    trust = kernel_trust()
    got = trust["reviewed_in"].get(op, trust["pinned_release"])
    return None if op in trust["untrusted"] or got is None else release_key(got)


def kernel_since(op: str, release: str) -> bool:
    """op's CPU kernel is ``release``'s or a later one's (csrc pg_kernel_since): its rule's
    clauses for the newer kernels hold, such as a defect that release fixed, no longer
    refused."""
    got = kernel_release(op)
    return got is not None and got >= release_key(release)


def kernel_before(op: str, release: str) -> bool:
    """op's CPU kernel is trusted and of a release before ``release`` (csrc
    pg_kernel_before): what an older kernel's own behaviour (its abort, its overrun) needs"""
    got = kernel_release(op)
    return got is not None and got < release_key(release)


def bf16_if_taken(op: str, release: str = "0.25.3") -> tuple[Type, ...]:
    """(BF16,) where op's reviewed kernel takes BF16 from ``release`` on (kernel_since), so
    that an OpInfo's types list every type its rule lets through: () elsewhere"""
    return (Type.BF16,) if kernel_since(op, release) else ()


def rope_ndims0_defect(op: str = "ROPE") -> str:
    """The defect a rope sample with n_dims = 0 (not VISION) meets in this build:
    "rope-ndims0-hang" where the op's kernel is not known to be one of 0.20.2 or before
    (kernel_release: untrusted, or a later release's such as 0.25.3's, which hangs there; a
    prebuilt ggml's is unknown), whose rule then refuses it (csrc pg_kernel_before); ""
    where it is (it copies the row)."""
    got = kernel_release(op)
    return "" if got is not None and got < release_key("0.20.3") else "rope-ndims0-hang"


# the quantized types the CPU writes F32 rows into (the CPU backend's from_float: cpy, cast,
# set_rows, and add and add1 into a quantized a's type), compared exactly with ggml's own
# quantization of the same rows (pyggml.quantize, bit for bit gguf-py's where gguf quantizes:
# tests/test_quant.py). Not IQ4_NL: its CPU row
# quantizer is not its chunk quantizer (no search; 62 % of blocks differ on normal data), and
# nothing else computes the former. Not Q8_1 and Q8_K: nothing reads them back.
CONVERTED = tuple(t for t in quantized_but(*SLOW_TO_QUANTIZE)
                  if t.has_cpu_from_float and t.name != "IQ4_NL")
IQ4_NL_WHY = ("into IQ4_NL: the CPU's row quantizer (no search) is not ggml_quantize_chunk's, which pyggml.quantize "
              "runs (62 % of blocks differ on normal data, mean squared error 0.0248 against 0.0232): no "
              "independent reference computes it")


def round_trip(x: np.ndarray, t: Type) -> np.ndarray:
    """x (rows along the last axis) as ggml stores it in the quantized type t: its own
    quantization of the F32 values, and back, as float64."""
    import pyggml
    rows = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    q = pyggml.quantize(t, rows)
    return pyggml.dequantize(t, q, rows.shape).reshape(x.shape).astype(np.float64)


CONVERT_NOTE = ("a quantized result is compared exactly with ggml's own quantization of the same F32 rows "
                "(pyggml.quantize, checked bit for bit against gguf-py in tests/test_quant.py where gguf quantizes), "
                "but Q8_0: the CPU's x86 quantizer rounds halves to even where ggml's reference quantizer rounds "
                "them away from zero, and BF16 sources (8 significant bits) hit such halves (measured NMSE "
                "2.6e-6, a step at a few values), hence 1e-5")
CONVERT_TOL = {Type.Q8_0: 1e-5}
