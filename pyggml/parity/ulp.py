"""Every F16 and BF16 input of ggml's one-input elementwise ops, and a dense F32 sweep,
against correctly rounded references: the error of each op in ULPs of its output type.

A sample-based check (``pyggml parity``) measures the typical error of an op; this one
tries every input a 16-bit type has (65,536 bit patterns, NaNs and infinities included)
and, for F32, every exponent of both signs plus the neighbourhood of each threshold the
CPU kernels branch on (``THRESHOLDS``). The error of one result is the distance, in
representable values of the output type, between ggml's result and the exact result
rounded to nearest-even in that type: 0 is correctly rounded, 1 is faithful.

The exact result comes from float64 formulas written for accuracy, not from the
kernels' formulas (``REFERENCES``: no cancellation, the limits at the infinities, NaN in
gives NaN out). A float64 result within a few float64 ulps of the exact one rounds to
the same 16-bit or F32 value unless the exact one lies within that distance of a
midpoint between two of them; ``tests/test_ulp.py`` checks the formulas against mpmath
at 60 digits on thousands of inputs, the infinities and the thresholds included.

NaNs are counted apart: ``nan_lost`` where the exact result is NaN and ggml's is a number
(relu(NaN) = 0), ``nan_made`` where ggml returns NaN for an input with a numeric result.

``BOUNDS`` holds, for each op and type measured on the pinned ggml, the largest error
with the reason it is larger than 1 ULP (a defect record's id where it is one);
``pyggml parity ulp`` prints the table and exits 1 when a measurement exceeds its bound.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Callable, Iterable

import numpy as np

import pyggml
from pyggml import Type
from pyggml.errors import ArgumentError

__all__ = ["BOUNDS", "REFERENCES", "THRESHOLDS", "Bound", "Row", "all_values", "f32_inputs", "measure",
           "ordered", "round_to", "sweep", "ulp_distance", "from_bits", "to_bits"]

# --- the formats ------------------------------------------------------------------------------

# significand bits (with the implicit one), the exponent of the smallest normal, the largest finite
_FORMAT = {
    Type.F16: (11, -14, 65504.0),
    Type.BF16: (8, -126, float.fromhex("0x1.fep127")),
    Type.F32: (24, -126, float.fromhex("0x1.fffffep127")),
}
_BITS = {Type.F16: np.uint16, Type.BF16: np.uint16, Type.F32: np.uint32}


def _format(t: Type) -> tuple[int, int, float]:
    """The format of t (the one check of the type argument of every function here)."""
    if t not in _FORMAT:
        raise ArgumentError(f"ulp: {Type(t).name} is not a float type the sweep measures (F16, BF16, F32)")
    return _FORMAT[t]


def round_to(x: np.ndarray, t: Type) -> np.ndarray:
    """float64 values rounded to the nearest value of F16, BF16 or F32 (ties to even,
    overflow to infinity, subnormals kept), as float64: one rounding, from the float64 value
    itself (converting through F32 first would round twice)."""
    p, emin, big = _format(t)
    x = np.array(x, np.float64)
    fin = np.isfinite(x) & (x != 0)
    v = x[fin]
    _, e = np.frexp(v)                                  # v = m 2^e, 0.5 <= |m| < 1
    q = np.maximum(e - p, emin - p + 1)                 # the exponent of one unit in the last place
    r = np.ldexp(np.rint(np.ldexp(v, -q)), q)           # exact scalings; rint: ties to even
    # rounded past the largest finite value (at or past half a unit above it): infinity
    r = np.where(np.abs(r) > big, np.copysign(np.inf, r), r)
    x[fin] = r
    return x


def to_bits(v: np.ndarray, t: Type) -> np.ndarray:
    """The bit patterns of values already representable in t (round_to's results, or
    ggml's), as uint16 / uint32; NaN becomes the type's quiet NaN."""
    _format(t)
    v = np.asarray(v, np.float64)
    if t == Type.F16:
        return v.astype(np.float16).view(np.uint16)
    f = v.astype(np.float32).view(np.uint32)
    return f if t == Type.F32 else (f >> 16).astype(np.uint16)


def from_bits(b: np.ndarray, t: Type) -> np.ndarray:
    """The float64 values of bit patterns of t (NaNs stay NaN)."""
    _format(t)
    b = np.asarray(b)
    if t == Type.F16:
        return b.astype(np.uint16).view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore"):         # (signalling NaNs become quiet ones)
        if t == Type.BF16:
            return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return b.astype(np.uint32).view(np.float32).astype(np.float64)


def ordered(b: np.ndarray, t: Type) -> np.ndarray:
    """Bit patterns as integers in the order of the values they stand for, one apart for
    adjacent values: +0 and -0 are both 0, the largest finite value and infinity adjacent."""
    _format(t)
    sign = 31 if t == Type.F32 else 15
    b = np.asarray(b).astype(np.int64)
    mag = b & ((1 << sign) - 1)
    return np.where(b >> sign, -mag, mag)


def ulp_distance(a: np.ndarray, b: np.ndarray, t: Type) -> np.ndarray:
    """How many values of t lie between bit patterns a and b, plus one (0: the same value)."""
    return np.abs(ordered(a, t) - ordered(b, t))


def all_values(t: Type) -> np.ndarray:
    """Every bit pattern of a 16-bit type, in order (uint16)."""
    if t not in (Type.F16, Type.BF16):
        raise ArgumentError(f"all_values: {t.name} is not a 16-bit float type (F16, BF16)")
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


# --- the references ---------------------------------------------------------------------------

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _times(x, s):
    """x * s where s -> 0 as x -> -inf: the limit 0 (with x's sign) where x is infinite and s 0."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(x) & (s == 0), np.copysign(0.0, x), x * s)


def _nan_kept(f):
    return lambda x: np.where(np.isnan(x), np.nan, f(x))


def ref_gelu(x):
    """x Phi-tanh(x) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): no 1 + tanh to cancel."""
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return _times(x, _sigmoid(2.0 * u))


def ref_gelu_erf(x):
    """x Phi(x) = x erfc(-x / sqrt 2) / 2: no 1 + erf to cancel."""
    return _times(x, 0.5 * _erfc(-x / math.sqrt(2.0)))


def ref_hardswish(x):
    return _times(x, np.clip(x + 3.0, 0.0, 6.0) / 6.0)


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


LEAKY_SLOPE = 0.1                   # the negative slope the sweep passes to leaky_relu
XIELU_PARAMS = (0.8, 0.8, 0.5, -1e-6)   # alpha_n, alpha_p, beta, eps (the values HF's xIELU starts from)


def _xielu(x):
    from pyggml.opinfo.activation import ref_xielu
    return ref_xielu(x, *XIELU_PARAMS)


# the exact result of each op, from float64 formulas that neither cancel nor overflow early
# (the math of the op as ggml.h states it, not the kernel's formula)
REFERENCES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sqr": lambda x: x * x,
    "sqrt": np.sqrt,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "expm1": np.expm1,
    "softplus": lambda x: np.logaddexp(0.0, x),
    "abs": np.abs,
    "sgn": np.sign,
    "neg": np.negative,
    "step": _nan_kept(lambda x: (x > 0).astype(np.float64)),
    "exp": np.exp,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round_half_away,
    "trunc": np.trunc,
    "tanh": np.tanh,
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "relu": _nan_kept(lambda x: np.where(x > 0, x, 0.0)),
    "leaky_relu": _nan_kept(lambda x: np.where(x > 0, x, float(np.float32(LEAKY_SLOPE)) * x)),
    "sigmoid": _sigmoid,
    "gelu": ref_gelu,
    "gelu_erf": ref_gelu_erf,
    "gelu_quick": lambda x: _times(x, _sigmoid(1.702 * x)),
    "silu": lambda x: _times(x, _sigmoid(x)),
    "hardswish": ref_hardswish,
    "hardsigmoid": lambda x: np.clip((x + 3.0) / 6.0, 0.0, 1.0),
    "xielu": _xielu,
}

# how each op is called on one tensor (the default: pyggml.<op>(ctx, a))
_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "leaky_relu": lambda ctx, a: pyggml.leaky_relu(ctx, a, LEAKY_SLOPE, False),
    "xielu": lambda ctx, a: pyggml.xielu(ctx, a, *XIELU_PARAMS),
}

# the F32 values the CPU kernels branch at, or where their formulas change behaviour
# (unary-ops.cpp, vec.h): the F32 sweep tries the 512 values around each, and 0 for every op
THRESHOLDS: dict[str, tuple[float, ...]] = {
    "gelu": (-10.0, 10.0, 65520.0, -65520.0, -3.5),       # table range; F16's overflow; cancellation
    "gelu_quick": (65520.0, -65520.0, -5.0),               # F16 table without clamp
    "gelu_erf": (-3.5, -5.5),
    "softplus": (20.0, -17.0, -88.0, -103.0),              # x > 20: x; 1 + e^x rounds to 1; expf's underflow
    "expm1": (1e-7, -1e-7, 88.72, -17.0),                  # expf(x) - 1 cancels; overflow
    "exp": (88.72, -87.33, -103.97),                       # overflow; subnormal results; underflow
    "sigmoid": (-88.72, 88.72, -17.0),
    "silu": (-88.72, 88.72, -17.0),
    "tanh": (9.0, -9.0, 1e-4),
    "elu": (-17.0, 1e-7),
    "hardswish": (-3.0, 3.0),
    "hardsigmoid": (-3.0, 3.0),
    "round": (0.5, -0.5, 1.5, 2.5, 8388608.0),
    "floor": (1.0, -1.0, 8388608.0),
    "ceil": (1.0, -1.0, 8388608.0),
    "trunc": (1.0, -1.0, 8388608.0),
    "log": (1.0, 1.17549435e-38),
    "sqrt": (1.17549435e-38,),
    "sin": (3.14159265, 1e5, 1e7),
    "cos": (1.57079633, 1e5, 1e7),
    "xielu": (-1e-6,),
}


def f32_inputs(op: str = "", per_binade: int = 64, around: int = 256) -> np.ndarray:
    """The dense F32 sweep's inputs (uint32 bit patterns, sorted, unique): ``per_binade``
    significands spread over each of the 256 exponent fields of both signs (subnormals,
    infinities and NaNs included), and the ``around`` values on each side of 0 and of
    each of the op's thresholds."""
    step = (1 << 23) // per_binade
    sig = (np.arange(per_binade, dtype=np.uint64) * step + (np.arange(per_binade, dtype=np.uint64) * 7919) % step)
    sig[0] = 0
    exps = np.arange(256, dtype=np.uint64) << 23
    pos = (exps[:, None] + sig[None, :]).reshape(-1)
    parts = [pos, pos | (1 << 31)]
    for c in (0.0,) + THRESHOLDS.get(op, ()):
        b = int(np.float32(c).view(np.uint32))
        o = ordered(np.array([b], np.uint32), Type.F32)[0]
        k = np.arange(o - around, o + around + 1, dtype=np.int64)
        parts.append(np.where(k < 0, (-k) | (1 << 31), k).astype(np.uint64))
    return np.unique(np.concatenate(parts).astype(np.uint32))


# --- what ggml computes -----------------------------------------------------------------------

def ggml_result(op: str, bits: np.ndarray, t: Type) -> tuple[np.ndarray, Type]:
    """ggml's result of ``op`` on one contiguous tensor of type t holding ``bits``, on
    one thread: its bit patterns and its type."""
    n = bits.size
    with pyggml.Context(4 * n * 4 + (1 << 20)) as ctx:
        if t == Type.F16:
            a = ctx.from_numpy(np.ascontiguousarray(bits, np.uint16).view(np.float16))
        elif t == Type.F32:
            a = ctx.from_numpy(np.ascontiguousarray(bits, np.uint32).view(np.float32))
        else:
            a = ctx.from_numpy(np.ascontiguousarray(bits, np.uint16), type=Type.BF16)
        call = _CALLS.get(op, lambda c, x: getattr(pyggml, op)(c, x))
        r = call(ctx, a)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        g.compute(1)
        return np.array(r.numpy()).reshape(-1).view(_BITS[r.type]), r.type


def exact(op: str, x: np.ndarray) -> np.ndarray:
    """The reference's float64 result of op at x (float64), warnings of overflow and
    invalid operations silenced (they are the results)."""
    with np.errstate(all="ignore"):
        return np.asarray(REFERENCES[op](np.asarray(x, np.float64)), np.float64).reshape(np.shape(x))


# --- one measurement --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Bound:
    """What is known of an op's error on one type: its largest error in ULPs, why it
    is over 1 ULP, why NaNs differ (empty: they must not), and the defect record it is."""
    ulp: int = 1
    why: str = ""
    nan: str = ""
    defect: str = ""


@dataclasses.dataclass(frozen=True)
class Row:
    op: str
    type: str               # the input's type ("F16", "BF16", "F32"); the result has the same type
    inputs: int
    max_ulp: int            # over the inputs where neither result is NaN
    worst_x: float          # the first input where it occurs
    worst_ggml: float
    worst_exact: float      # the exact result (float64) at worst_x
    not_rounded: int        # inputs whose result is not the correctly rounded one
    over_1: int             # inputs more than 1 ULP off
    nan_lost: int           # the exact result is NaN, ggml's a number
    nan_made: int           # ggml's result is NaN, the exact one a number
    nan_example: float      # the first input where NaNs differ (NaN where none)
    bound: Bound

    @property
    def within(self) -> bool:
        return self.max_ulp <= self.bound.ulp and (self.nan_lost + self.nan_made == 0 or bool(self.bound.nan))

    def as_dict(self) -> dict:
        """As JSON takes it: the infinities and NaN as the strings "inf", "-inf", "nan"."""
        d = {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in dataclasses.asdict(self).items()}
        d["within"] = self.within
        return d


def bound(op: str, t: Type) -> Bound:
    """The largest error measured on the pinned ggml for op on t, with the reason it is
    more than 1 ULP (or NaN differs); 1 ULP (faithful rounding) where there is none."""
    return BOUNDS.get((op, t.name), BOUNDS.get((op, "*"), Bound(1)))


def measure(op: str, t: Type, bits: np.ndarray | None = None) -> Row:
    """ggml's error for op on every value of t (16-bit types) or on f32_inputs(op)."""
    if op not in REFERENCES:
        raise ArgumentError(f"ulp: no reference for {op!r} (the ops with one: {', '.join(REFERENCES)})")
    _format(t)
    if bits is None:
        bits = all_values(t) if t != Type.F32 else f32_inputs(op)
    x = from_bits(bits, t)
    got, rt = ggml_result(op, bits, t)
    ex = exact(op, x)
    want = to_bits(round_to(ex, rt), rt)
    gv = from_bits(got, rt)
    g_nan, e_nan = np.isnan(gv), np.isnan(ex)
    both = ~g_nan & ~e_nan
    d = np.where(both, ulp_distance(got, want, rt), 0)
    i = int(np.argmax(d))
    nan_diff = np.flatnonzero(g_nan != e_nan)
    b = bound(op, t)
    return Row(op=op, type=t.name, inputs=int(bits.size), max_ulp=int(d[i]), worst_x=float(x[i]),
               worst_ggml=float(gv[i]), worst_exact=float(ex[i]), not_rounded=int((d > 0).sum()),
               over_1=int((d > 1).sum()), nan_lost=int((e_nan & ~g_nan).sum()), nan_made=int((g_nan & ~e_nan).sum()),
               nan_example=float(x[nan_diff[0]]) if nan_diff.size else math.nan, bound=b)


def _types_of(op: str) -> tuple[Type, ...]:
    from pyggml.opinfo import registry
    info = registry().get(op)
    taken = info.types if info is not None else (Type.F32,)
    return tuple(t for t in (Type.F16, Type.BF16, Type.F32) if t in taken or t == Type.F32)


def sweep(ops: Iterable[str] | None = None, types: Iterable[str] | None = None) -> list[Row]:
    """Measure every op of REFERENCES (or those matching the ``ops`` patterns) on each of
    its types (F16 and BF16 where its OpInfo lists them; F32 always) that ``types`` keeps.
    Ops this ggml lacks, and types its kernel refuses (an older release's), are left out."""
    from pyggml.errors import GGMLError, GGMLVersionError
    pats = list(ops) if ops else ["*"]
    keep = {s.upper() for s in types} if types else None
    rows = []
    for op in REFERENCES:
        if not any(fnmatch.fnmatchcase(op, p) for p in pats):
            continue
        for t in _types_of(op):
            if keep is not None and t.name not in keep:
                continue
            try:
                rows.append(measure(op, t))
            except GGMLVersionError:        # the op is not in this ggml
                break
            except GGMLError:               # the type is refused by this ggml's kernel (its rule says why)
                continue
    return rows


# --- the bounds measured on the pinned ggml (0.25.3) ------------------------------------------
# Each entry: the largest error measured, and why it is over 1 ULP. Filled from
# `pyggml parity ulp` on the pin; a test asserts that no op exceeds its bound there.

_NAN_DROPPED = ("ggml's kernel tests x > 0 (or clamps with fmaxf/fminf), so NaN in gives a number out "
                "(numpy and torch keep NaN): defect unary-nan-dropped")
_NEG_INF_NAN = ("at -inf the kernel's x * s(x) is -inf * 0 = NaN (as torch computes it too); "
                "the limit, and the reference, is -0")
_SUBNORMAL_FLUSH = ("1 / (1 + expf(-x)) is 0 once expf(-x) overflows (x < -88.72): results below 2^-126 "
                    "(subnormal in F32 and BF16) become 0, an absolute error under 1.2e-38")
_TAIL = ("ggml's formula 0.5 x (1 + {f}) cancels in F32 for x < -3.5 and is 0 below about {zero} "
         "(an absolute error under 1e-7), where the result is still a normal F32 and BF16 number")


def _bounds() -> dict[tuple[str, str], Bound]:
    b: dict[tuple[str, str], Bound] = {}
    for op in ("relu", "sgn", "step", "hardsigmoid", "leaky_relu"):
        b[(op, "*")] = Bound(1, nan=_NAN_DROPPED, defect="unary-nan-dropped")
    expm1 = "expf(x) - 1 cancels for |x| << 1: 0 for |x| < 2^-25 (defect expm1-cancellation)"
    b[("expm1", "BF16")] = Bound(13183, expm1, defect="expm1-cancellation")
    b[("expm1", "F32")] = Bound(864001233, expm1, defect="expm1-cancellation")
    softplus = "logf(1 + expf(x)) is 0 for x < -16.6, where the result is e^x (defect softplus-underflow)"
    b[("softplus", "BF16")] = Bound(13156, softplus, defect="softplus-underflow")
    b[("softplus", "F32")] = Bound(861549146, softplus, defect="softplus-underflow")
    b[("tanh", "F32")] = Bound(2, "ggml calls libm's tanhf, which is not correctly rounded (2 ULP at most here)")
    b[("sigmoid", "BF16")] = Bound(24, _SUBNORMAL_FLUSH)
    b[("sigmoid", "F32")] = Bound(954078, _SUBNORMAL_FLUSH)
    b[("silu", "F16")] = Bound(1, nan=_NEG_INF_NAN)
    b[("silu", "BF16")] = Bound(647, "x / (1 + expf(-x)): " + _SUBNORMAL_FLUSH, nan=_NEG_INF_NAN)
    b[("silu", "F32")] = Bound(35840813, "x / (1 + expf(-x)): " + _SUBNORMAL_FLUSH, nan=_NEG_INF_NAN)
    table = ("the F16 table holds F16(ggml's F32 formula), and that formula's 1 + {f} cancels for x < -3.5: "
             "2 ULP at the smallest F16 results")
    gelu_nan = ("at -inf the F16 table's value and the BF16 kernel's 0.5 x (1 + tanh u) are -inf * 0 = NaN (as "
                "torch computes it too); the limit, and the reference, is -0 (the F32 kernel returns 0 for x <= -10)")
    b[("gelu", "F16")] = Bound(2, table.format(f="tanh(u)"), nan=gelu_nan)
    b[("gelu", "BF16")] = Bound(13190, _TAIL.format(f="tanh(u)", zero="-5.2"), nan=gelu_nan)
    b[("gelu", "F32")] = Bound(863637413, _TAIL.format(f="tanh(u)", zero="-5.2") +
                              "; the F32 kernel reads the F16 table for -10 < x < 10 (F16's precision)")
    b[("gelu_erf", "F16")] = Bound(2, "0.5 x (1 + erff(x / sqrt 2)) in F32 cancels for x < -3.5: 2 ULP at the "
                                      "smallest F16 results", nan=_NEG_INF_NAN)
    b[("gelu_erf", "BF16")] = Bound(13215, _TAIL.format(f="erff(x / sqrt 2)", zero="-5.6"), nan=_NEG_INF_NAN)
    b[("gelu_erf", "F32")] = Bound(864353250, _TAIL.format(f="erff(x / sqrt 2)", zero="-5.6"), nan=_NEG_INF_NAN)
    b[("gelu_quick", "F16")] = Bound(1, nan=_NEG_INF_NAN)
    b[("gelu_quick", "BF16")] = Bound(554, "x / (1 + expf(-1.702 x)) is -0 once expf overflows (x < -52.1), "
                                           "where the result is still a normal BF16 number (under 1e-37)",
                                      nan=_NEG_INF_NAN)
    b[("gelu_quick", "F32")] = Bound(939528192, "the F32 kernel rounds x to F16 with no clamp: x >= 65520 "
                                                "becomes inf (defect gelu-quick-f32-table-overflow), and reads "
                                                "F16's precision from the table elsewhere",
                                     nan="x <= -65520 becomes -inf in F16, and the table's value there is NaN "
                                         "(defect gelu-quick-f32-table-overflow)",
                                     defect="gelu-quick-f32-table-overflow")
    b[("hardswish", "F16")] = Bound(1, nan=_NEG_INF_NAN)
    b[("hardswish", "BF16")] = Bound(1, nan=_NEG_INF_NAN)
    b[("hardswish", "F32")] = Bound(2, "x * fminf(1, fmaxf(0, (x + 3) / 6)) rounds twice in F32",
                                    nan=_NEG_INF_NAN)
    b[("xielu", "F32")] = Bound(732, "alpha_n (expm1f(x) - x) + beta x cancels near the function's zero "
                                     f"(x ~ -0.76 for {XIELU_PARAMS}): an error of about 1e-7 of either term")
    return b


BOUNDS: dict[tuple[str, str], Bound] = _bounds()


def format_markdown(rows: list[Row]) -> str:
    """The sweep as a Markdown table per op, each bound's reasons under it (docs/ulp.md)."""
    import pyggml
    out = ["# ULP sweep: one-input elementwise ops against correctly rounded results", "",
           f"ggml {pyggml.ggml_version()}: `pyggml parity ulp --markdown F`. Max ULP is over the inputs where "
           "neither result is NaN; *not CR*: inputs whose result is not the correctly rounded one; NaN-: the exact "
           "result is NaN and ggml's a number; NaN+: ggml's is NaN and the exact one a number.", ""]
    for op in dict.fromkeys(r.op for r in rows):
        mine = [r for r in rows if r.op == op]
        out += [f"## {op}", "", "| type | inputs | max ULP | at x | ggml | exact | not CR | >1 ULP | NaN- | NaN+ | bound |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in mine:
            out.append(f"| {r.type} | {r.inputs} | {r.max_ulp} | {r.worst_x:.6g} | {r.worst_ggml:.6g} | "
                       f"{r.worst_exact:.6g} | {r.not_rounded} | {r.over_1} | {r.nan_lost} | {r.nan_made} | "
                       f"{r.bound.ulp}{'' if r.within else ' **beyond**'} |")
        notes = dict.fromkeys(f"{r.type}: {text}" for r in mine for text in (r.bound.why, r.bound.nan) if text)
        out += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    return "\n".join(out) + "\n"


def format_table(rows: list[Row]) -> str:
    """The sweep as text: one line per op and type, worst first within each op."""
    head = (f"{'op':<12} {'type':<5} {'inputs':>7} {'max ulp':>8} {'bound':>6}  {'at x':>13} {'ggml':>13} "
            f"{'exact':>13} {'not CR':>7} {'>1ulp':>6} {'NaN-':>5} {'NaN+':>5}  verdict")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r.op:<12} {r.type:<5} {r.inputs:>7} {r.max_ulp:>8} {r.bound.ulp:>6}  {r.worst_x:>13.6g} "
                   f"{r.worst_ggml:>13.6g} {r.worst_exact:>13.6g} {r.not_rounded:>7} {r.over_1:>6} "
                   f"{r.nan_lost:>5} {r.nan_made:>5}  {'ok' if r.within else 'BEYOND'}")
    return "\n".join(out)
