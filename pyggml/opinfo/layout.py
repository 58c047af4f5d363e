"""OpInfos of the [layout] family: copies and casts, reshapes and views, repeat, concat,
set, get_rows / set_rows, diag, pad, roll, tri, arange, window partitions.

References work in ggml's index order where it helps: :func:`_gg` turns a numpy-order
array into a 4-d array indexed ``[i0, i1, i2, i3]`` (ne order), :func:`_np` back.
For the copy ops (cpy, cast, set_rows) the sample type ``t`` is the type of the
RESULT (the destination), so that each destination type gets its own tolerance.
"""

from __future__ import annotations

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import (BYTES_WHY, CONVERT_NOTE, CONVERT_TOL, CONVERT_WHY, CONVERTED, DOT_ONLY, DOT_ONLY_WHY, FLOATS,
                                   IQ4_NL_WHY, QUANTIZED, SHAPE_WHY, SLOW_TO_QUANTIZE, SLOW_WHY, VIEW_WHY, normal,
                                   quantized_but, round_trip, tile_to, unsampled)

PLAIN = FLOATS + (Type.I32,)
# the types the byte-moving ops (views, reshapes, copies of one type, concat) take: every
# non-quantized one the CPU kernels copy by element size
MOVABLE = PLAIN + (Type.I16, Type.I8)
def _gg(x: np.ndarray) -> np.ndarray:
    """numpy order -> 4-d, indexed [i0, i1, i2, i3] (a view)"""
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape).transpose(3, 2, 1, 0)


def _np(g: np.ndarray) -> np.ndarray:
    """[i0, i1, i2, i3] -> numpy order (4-d)"""
    return np.ascontiguousarray(g.transpose(3, 2, 1, 0))


def _vals(rng, shape, t: Type) -> np.ndarray:
    """normal values, or small integers for integer types"""
    if t == Type.I8:
        return rng.integers(-100, 100, size=shape)
    if t in (Type.I32, Type.I16, Type.I64):
        return rng.integers(-1000, 1000, size=shape)
    return normal(rng, shape)


def _q_ok(t: Type) -> bool:
    return Type(t).is_quantized


def _ncol(t: Type, plain: int = 5) -> int:
    """a row length: whole blocks for a quantized type (at least 64 values)"""
    if not _q_ok(t):
        return plain
    return max(64, t.blck_size)


# --- dup, cont --------------------------------------------------------------------------------

def _copy_samples(rng, t):
    """one tensor over shapes and layouts; quantized types keep dim 0 (rows of whole blocks)"""
    if _q_ok(t):
        yield Sample((Arg(normal(rng, (3, 64)), t),), "contiguous (3, 64)")
        yield Sample((Arg(normal(rng, (2, 3, 2, 32)), t, "permuted", (0, 2, 1, 3)),), "permuted dims 1, 2")
        return
    for shape in ((7,), (3, 5), (2, 1, 4), (2, 3, 1, 5)):
        yield Sample((Arg(_vals(rng, shape, t), t),), f"contiguous {shape}")
    yield Sample((Arg(_vals(rng, (3, 5), t), t, "transposed"),), "transposed (3, 5)")
    yield Sample((Arg(_vals(rng, (2, 3, 4, 5), t), t, "permuted", (2, 0, 3, 1)),), "permuted (2, 0, 3, 1)")
    yield Sample((Arg(_vals(rng, (2, 3, 4), t), t, "strided"),), "strided rows")


def _cont_nd_samples(n):
    def samples(rng, t):
        # (numpy shape of a, its layout, the new ne)
        if _q_ok(t):
            cases = [((4, 64), "contiguous", (128, 2, 1, 1)), ((2, 3, 64), "contiguous", (64, 3, 2, 1))]
        else:
            cases = [((3, 4), "contiguous", (12, 1, 1, 1)), ((4, 6), "transposed", (8, 3, 1, 1)),
                     ((2, 3, 4, 2), "permuted", (6, 4, 2, 1)), ((2, 3, 4), "strided", (4, 3, 2, 1)),
                     ((1, 2, 3, 4), "permuted", (2, 3, 2, 2))]
        for shape, layout, ne in cases:
            ne = ne[:n]
            if int(np.prod(ne)) != int(np.prod(shape)):
                ne = ne[:n - 1] + (int(np.prod(shape)) // int(np.prod(ne[:n - 1])),)
            perm = (1, 3, 0, 2) if layout == "permuted" else (0, 1, 2, 3)
            if layout == "permuted":
                shape = (1,) * (4 - len(shape)) + shape
            yield Sample((Arg(_vals(rng, shape, t), t, layout, perm),) + tuple(ne), f"{layout} {shape} -> {ne}")
    return samples


def _ref_cont_nd(a, *ne):
    return a.reshape(-1).reshape(tuple(reversed(ne)))


# --- repeat -----------------------------------------------------------------------------------

_REPEAT_TYPES = (Type.F32, Type.F16, Type.BF16, Type.I32, Type.I16)


def _repeat_samples(rng, t):
    for ash, bsh in (((3, 4), (6, 8)), ((1, 4), (3, 4)), ((2, 1, 3), (2, 5, 6)), ((5,), (2, 3, 10)),
                     ((1, 2, 1, 3), (2, 4, 3, 3)), ((3, 4), (3, 4))):
        yield Sample((Arg(_vals(rng, ash, t), t), Arg(np.zeros(bsh), Type.F32, param=False)), f"{ash} to {bsh}")
    yield Sample((Arg(_vals(rng, (2, 3, 4), t), t, "strided"), Arg(np.zeros((4, 3, 8)), Type.F32, param=False)),
                 "strided rows")
    yield Sample((Arg(_vals(rng, (2, 3, 1, 4), t), t, "permuted", (0, 2, 1, 3)),
                  Arg(np.zeros((2, 3, 2, 8)), Type.F32, param=False)), "permuted dims 1, 2")


def _repeat_4d_samples(rng, t):
    for s in _repeat_samples(rng, t):
        bsh = s.args[1].value.shape
        ne = tuple(reversed((1,) * (4 - len(bsh)) + bsh))
        yield Sample((s.args[0],) + ne, s.name)


def _ref_repeat_4d(a, ne0, ne1, ne2, ne3):
    return tile_to(a, (ne3, ne2, ne1, ne0))


# --- concat -----------------------------------------------------------------------------------

def _concat_samples(rng, t):
    if _q_ok(t):
        for dim, ash, bsh in ((0, (3, 64), (3, 32)), (1, (2, 64), (3, 64)), (2, (2, 1, 32), (1, 1, 32))):
            yield Sample((Arg(normal(rng, ash), t), Arg(normal(rng, bsh), t), dim), f"dim {dim}")
        return
    for dim, ash, bsh in ((0, (2, 3, 4), (2, 3, 5)), (1, (2, 3, 4), (2, 1, 4)), (2, (2, 3, 4), (4, 3, 4)),
                          (3, (1, 2, 3, 4), (2, 2, 3, 4)), (0, (5,), (1,))):
        yield Sample((Arg(_vals(rng, ash, t), t), Arg(_vals(rng, bsh, t), t), dim), f"dim {dim} {ash} + {bsh}")
    yield Sample((Arg(_vals(rng, (4, 3), t), t, "transposed"), Arg(_vals(rng, (4, 2), t), t), 0), "a transposed")
    yield Sample((Arg(_vals(rng, (2, 3, 4), t), t), Arg(_vals(rng, (2, 2, 4), t), t, "strided"), 1), "b strided")
    yield Sample((Arg(_vals(rng, (2, 3, 4, 2), t), t, "permuted", (1, 0, 3, 2)),
                  Arg(_vals(rng, (2, 3, 4, 2), t), t, "permuted", (3, 2, 1, 0)), 2), "both permuted")


def _ref_concat(a, b, dim):
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    return np.concatenate([a4, b4], axis=3 - dim)


# --- set --------------------------------------------------------------------------------------

ES = 4   # set and the view ops are sampled for 4-byte types (F32, I32): the byte offsets and strides


def _place(a, b, nb1, nb2, nb3, offset):
    """a copy of (flat, contiguous) a with b written into view(a; nb1, nb2, nb3, offset)"""
    out = a.copy()
    flat = out.reshape(-1)
    g = _gg(b)
    for i3 in range(g.shape[3]):
        for i2 in range(g.shape[2]):
            for i1 in range(g.shape[1]):
                start = (offset + i1 * nb1 + i2 * nb2 + i3 * nb3) // ES
                flat[start:start + g.shape[0]] = g[:, i1, i2, i3]
    return out


def _a_strides(a_shape):
    """a's byte strides nb1..nb3 for a contiguous 4-byte tensor of numpy shape a_shape"""
    ne = tuple(reversed(a_shape)) + (1,) * (4 - len(a_shape))
    return ES * ne[0], ES * ne[0] * ne[1], ES * ne[0] * ne[1] * ne[2]


def _set_samples(rng, t):
    a = _vals(rng, (4, 6), t)                         # ne (6, 4): rows of 24 bytes
    yield Sample((Arg(a, t), Arg(_vals(rng, (2, 3), t), t), 24, 48, 96, 8), "2x3 block at (2, 0)")
    yield Sample((Arg(a, t), Arg(_vals(rng, (6,), t), t), 24, 24, 24, 24), "row 1")
    yield Sample((Arg(a, t), Arg(_vals(rng, (2, 2), t), t), 48, 96, 96, 0), "every other row")
    a3 = _vals(rng, (2, 3, 5), t)                     # ne (5, 3, 2)
    yield Sample((Arg(a3, t), Arg(_vals(rng, (2, 2, 3), t), t), 20, 60, 120, 4), "3-d block")
    yield Sample((Arg(a3, t), Arg(_vals(rng, (2, 2, 3), t), t, "permuted", (0, 2, 1, 3)), 20, 60, 120, 4),
                 "b permuted")
    yield Sample((Arg(a3, t), Arg(_vals(rng, (2, 3, 2), t), t, "strided"), 20, 60, 120, 12), "b strided rows")
    yield Sample((Arg(a, t), Arg(_vals(rng, (1,), t), t), 24, 48, 96, 92), "the last element")
    yield Sample((Arg(a, t), Arg(_vals(rng, (1,), t), t), 24, 48, 96, 96), "one element past a",
                 defect="set-bounds-off-by-one")


def _set_1d_samples(rng, t):
    a = _vals(rng, (4, 6), t)
    yield Sample((Arg(a, t), Arg(_vals(rng, (5,), t), t), 8), "5 elements from 2")
    yield Sample((Arg(a, t), Arg(_vals(rng, (24,), t), t), 0), "all of a")
    yield Sample((Arg(a, t), Arg(_vals(rng, (2, 6), t), t), 48), "two rows, a's strides")
    yield Sample((Arg(a, t), Arg(_vals(rng, (1,), t), t), 96), "one element past a", defect="set-bounds-off-by-one")


def _ref_set_1d(a, b, offset):
    return _place(a, b, *_a_strides(a.shape), offset)


def _set_2d_samples(rng, t):
    a = _vals(rng, (2, 4, 6), t)                      # ne (6, 4, 2)
    yield Sample((Arg(a, t), Arg(_vals(rng, (3, 2), t), t), 24, 4), "3 rows of 2")
    yield Sample((Arg(a, t), Arg(_vals(rng, (2, 4), t), t), 48, 0), "every other row")
    yield Sample((Arg(a, t), Arg(_vals(rng, (2, 2, 2), t), t), 24, 8), "3-d b, a's nb2")


def _ref_set_2d(a, b, nb1, offset):
    _, nb2, nb3 = _a_strides(a.shape)
    return _place(a, b, nb1, nb2, nb3, offset)


# --- cpy, cast --------------------------------------------------------------------------------

_CPY_TYPES = MOVABLE + CONVERTED


def _sources_for(dst: Type):
    """the source types the CPU kernel copies into dst"""
    if dst == Type.F32:         # (a quantized source is dequantized: exact, every type sampled)
        return (Type.F32, Type.F16, Type.BF16, Type.I32) + quantized_but(*SLOW_TO_QUANTIZE)
    if dst in (Type.F16, Type.BF16):
        return FLOATS
    if dst == Type.I32:
        return (Type.F32, Type.I32)
    if dst in (Type.I16, Type.I8):          # a copy of the same type only
        return (dst,)
    return FLOATS + (dst,)


def _src_vals(rng, shape, st, dst):
    if st in (Type.I32, Type.I16, Type.I8):
        return _vals(rng, shape, st)
    v = normal(rng, shape, 8.0 if dst == Type.I32 else 1.0)
    if dst == Type.I32:                     # away from the integers, where truncation jumps
        v = np.trunc(v) + np.where(v >= 0, 0.5, -0.5)
    return v


def _cpy_samples(rng, t):
    for st in _sources_for(t):
        if _q_ok(st) or _q_ok(t):
            # whole blocks per row; the result contiguous for a quantized destination
            a = Arg(_src_vals(rng, (4, 256), st, t), st)
            yield Sample((a, Arg(np.zeros((4, 256)), t, param=False)), f"{st.name} -> {t.name}")
            yield Sample((a, Arg(np.zeros((2, 2, 256)), t, param=False)), f"{st.name} -> {t.name} reshaped")
            if st != t:
                yield Sample((Arg(_src_vals(rng, (2, 2, 3, 256), st, t), st, "permuted", (0, 2, 1, 3)),
                              Arg(np.zeros((12, 256)), t, param=False)), f"{st.name} permuted -> {t.name}")
                if t == Type.F32:       # dequantized into a non-contiguous result of whole-block rows
                    yield Sample((a, Arg(np.zeros((2, 2, 1, 256)), t, "permuted", (0, 2, 1, 3), param=False)),
                                 f"{st.name} -> permuted {t.name}")
            else:
                # same quantized type into a non-contiguous result of another shape (block by block)
                yield Sample((Arg(normal(rng, (3, 2, 256)), st),
                              Arg(np.zeros((2, 3, 1, 256)), t, "permuted", (0, 2, 1, 3), param=False)),
                             f"{st.name} -> permuted {t.name}")
            continue
        yield Sample((Arg(_src_vals(rng, (3, 5), st, t), st), Arg(np.zeros((3, 5)), t, param=False)),
                     f"{st.name} -> {t.name}")
        yield Sample((Arg(_src_vals(rng, (3, 4), st, t), st), Arg(np.zeros((2, 6)), t, param=False)),
                     f"{st.name} -> {t.name} reshaped")
        yield Sample((Arg(_src_vals(rng, (1, 2, 3, 2), st, t), st), Arg(np.zeros((1, 2, 3, 2)), t, param=False)),
                     f"{st.name} -> {t.name} 4-d")
        yield Sample((Arg(_src_vals(rng, (3, 5), st, t), st, "transposed"), Arg(np.zeros((5, 3)), t, param=False)),
                     f"{st.name} transposed -> {t.name}")
        yield Sample((Arg(_src_vals(rng, (2, 3, 4), st, t), st),
                      Arg(np.zeros((2, 4, 3)), t, "transposed", param=False)), f"{st.name} -> transposed {t.name}")
        yield Sample((Arg(_src_vals(rng, (2, 3, 4, 2), st, t), st, "permuted", (2, 0, 3, 1)),
                      Arg(np.zeros((6, 8)), t, "strided", param=False)), f"{st.name} permuted -> strided {t.name}")


def _ref_convert(a, shape, dst: Type):
    """a's values in ``shape``, converted to dst: truncated toward 0 into an integer type,
    quantized and back into a quantized one"""
    out = a.reshape(-1).reshape(shape)
    if dst.is_quantized:
        return round_trip(out, dst)
    return np.trunc(out).astype(np.int64) if dst in (Type.I32, Type.I16, Type.I8) else out.astype(np.float64)


def _ref_cpy(a, b, types):
    if types[0] == types[1]:            # a copy of one type moves the stored values (blocks)
        return a.reshape(-1).reshape(b.shape).astype(np.float64)
    return _ref_convert(a, b.shape, Type(types[1]))       # the result has b's type


def _cast_samples(rng, t):
    for st in _sources_for(t):
        if _q_ok(st) or _q_ok(t):
            if st != t:
                yield Sample((Arg(_src_vals(rng, (2, 256), st, t), st), t), f"{st.name} -> {t.name}")
                yield Sample((Arg(_src_vals(rng, (2, 2, 1, 256), st, t), st, "permuted", (0, 2, 1, 3)), t),
                             f"{st.name} permuted -> {t.name}")
            continue
        for shape in ((3, 5), (7,), (2, 1, 3, 2)):
            yield Sample((Arg(_src_vals(rng, shape, st, t), st), t), f"{st.name} {shape} -> {t.name}")
        yield Sample((Arg(_src_vals(rng, (3, 5), st, t), st, "transposed"), t), f"{st.name} transposed -> {t.name}")
        yield Sample((Arg(_src_vals(rng, (2, 3, 4), st, t), st, "strided"), t), f"{st.name} strided -> {t.name}")


# --- reshape, view, permute, transpose --------------------------------------------------------

def _reshape_samples(rng, t):
    for shape, bsh in (((3, 4), (12,)), ((2, 3, 4), (4, 6)), ((24,), (2, 3, 2, 2)), ((1, 5), (5, 1)),
                       ((2, 3, 4, 5), (6, 20))):
        yield Sample((Arg(_vals(rng, shape, t), t), Arg(np.zeros(bsh), Type.F32, "contiguous" if len(bsh) < 2
                      else "transposed", param=False)), f"{shape} like {bsh}")


def _reshape_nd_samples(n):
    def samples(rng, t):
        for shape, ne in (((3, 4), (12, 1, 1, 1)), ((2, 3, 4), (6, 4, 1, 1)), ((24,), (2, 3, 2, 2)),
                          ((2, 3, 4, 5), (5, 4, 3, 2)), ((1, 7), (7, 1, 1, 1))):
            ne = ne[:n]
            if int(np.prod(ne)) != int(np.prod(shape)):
                ne = ne[:n - 1] + (int(np.prod(shape)) // int(np.prod(ne[:n - 1])),)
            yield Sample((Arg(_vals(rng, shape, t), t),) + tuple(ne), f"{shape} -> {ne}")
    return samples


def _ref_view(a, *args, types):
    """view(a; ne..., nb1.., offset) of contiguous a: the elements at byte offset + sum i_k nb_k"""
    es = types[0].type_size
    n = {2: 1, 4: 2, 6: 3, 8: 4}[len(args)]          # view_1d .. view_4d
    ne = list(args[:n]) + [1] * (4 - n)
    nb = [es] + list(args[n:2 * n - 1]) + [0] * (4 - n)   # the strides of unit dims do not matter
    offset = args[-1]
    flat = a.reshape(-1)
    g = np.empty(ne, dtype=a.dtype)
    for idx in np.ndindex(*ne):
        g[idx] = flat[(offset + sum(i * s for i, s in zip(idx, nb))) // es]
    return _np(g)


_VIEW_TYPES = MOVABLE


def _view_samples(n):
    def samples(rng, t):
        a = _vals(rng, (2, 4, 6), t)                  # ne (6, 4, 2): nb (1, 6, 24) elements
        cases = {                                     # (ne, nb1.. and offset in elements)
            1: [((5,), (), 2), ((48,), (), 0), ((1,), (), 47)],
            2: [((3, 2), (6,), 1), ((6, 4), (12,), 0), ((2, 3), (2,), 0), ((6, 8), (6,), 0)],
            # the last one overlaps (rows share elements): its gradient is not checked (view-grad-overlap)
            3: [((2, 2, 2), (6, 24), 2), ((3, 4, 1), (6, 24), 24), ((2, 2, 2), (12, 6), 0),
                ((2, 2, 2), (12, 1), 0)],
            4: [((2, 2, 2, 1), (6, 24, 48), 1), ((1, 2, 2, 2), (1, 12, 24), 0), ((3, 2, 1, 2), (12, 2, 24), 1)],
        }[n]
        es = t.type_size
        for ne, nb, off in cases:
            nb, off = tuple(es * s for s in nb), es * off
            yield Sample((Arg(a, t),) + ne + nb + (off,), f"ne {ne} nb {nb} offset {off}")
    return samples


def _permute_samples(rng, t):
    # axis 0 in place first: the gradient check multiplies the result, which needs contiguous rows
    for perm in ((0, 1, 2, 3), (0, 2, 1, 3), (0, 3, 1, 2), (1, 0, 2, 3), (2, 0, 3, 1), (3, 2, 1, 0)):
        yield Sample((Arg(_vals(rng, (2, 3, 4, 5), t), t),) + perm, f"{perm}")
    yield Sample((Arg(_vals(rng, (3, 4), t), t), 1, 0, 2, 3), "2-d")
    yield Sample((Arg(_vals(rng, (2, 3, 4), t), t, "transposed"), 2, 1, 0, 3), "of a transposed")


def _ref_permute(a, *axes):
    g = _gg(a)
    inv = [0] * 4
    for i, ax in enumerate(axes):
        inv[ax] = i
    return _np(g.transpose(inv))


def _transpose_samples(rng, t):
    # column vectors first: their transposes have contiguous rows, which the gradient check needs
    for shape in ((3, 1), (2, 4, 1), (2, 1, 3, 1), (3, 5), (2, 3, 4), (1, 4), (2, 1, 3, 2)):
        yield Sample((Arg(_vals(rng, shape, t), t),), f"{shape}")
    yield Sample((Arg(_vals(rng, (3, 5), t), t, "transposed"),), "of a transposed")


# --- get_rows, set_rows -----------------------------------------------------------------------

# get_rows dequantizes with the type's to_float: exact, so every type is sampled (but the slow ones)
_GET_ROWS_TYPES = PLAIN + quantized_but(*SLOW_TO_QUANTIZE)


def _get_rows_samples(rng, t):
    ncol = _ncol(t)
    # 2-d first: ggml's backward (get_rows_back) takes matrices only
    yield Sample((Arg(_vals(rng, (6, ncol), t), t), Arg(np.array([3, 0, 5, 3]), Type.I32)), "2-d, a repeated index")
    yield Sample((Arg(_vals(rng, (4, ncol), t), t), Arg(np.array([2]), Type.I32)), "one row")
    yield Sample((Arg(_vals(rng, (7, ncol), t), t), Arg(rng.permutation(7)[:5], Type.I32)), "5 of 7")
    a3 = _vals(rng, (2, 3, 4, ncol) if ncol < 256 else (1, 2, 2, ncol), t)
    ix = rng.integers(0, a3.shape[2], size=a3.shape[:2] + (3,))   # ne (3, n2, n3)
    yield Sample((Arg(a3, t), Arg(ix, Type.I32)), "4-d a, 3-d indices")
    yield Sample((Arg(a3, t, "permuted", (0, 2, 1, 3) if _q_ok(t) else (0, 1, 3, 2)), Arg(ix, Type.I32)),
                 "a permuted")
    if not _q_ok(t):
        yield Sample((Arg(_vals(rng, (2, 6, ncol), t), t, "strided"),
                      Arg(rng.integers(0, 6, size=(2, 3)), Type.I32, "transposed")), "a strided, indices transposed")


def _ref_get_rows(a, ix):
    ga, gi = _gg(a), _gg(ix)                           # a [n0, n1, n2, n3], ix [r, n2, n3, 1]
    out = np.empty((ga.shape[0], gi.shape[0], gi.shape[1], gi.shape[2]), dtype=a.dtype)
    for i12 in range(gi.shape[2]):
        for i11 in range(gi.shape[1]):
            for i10 in range(gi.shape[0]):
                out[:, i10, i11, i12] = ga[:, gi[i10, i11, i12, 0], i11, i12]
    return _np(out)


_SET_ROWS_TYPES = (Type.F32, Type.F16, Type.BF16, Type.I32) + CONVERTED


def _set_rows_samples(rng, t):
    ncol = _ncol(t)
    for st in (Type.F32, Type.F16):
        for it in (Type.I64, Type.I32):
            a = _vals(rng, (6, ncol), t)
            b = normal(rng, (3, ncol), 4.0)
            if t == Type.I32:
                b = np.round(b)
            yield Sample((Arg(a, t), Arg(b, st), Arg(rng.permutation(6)[:3], it)), f"{st.name} rows, {it.name}")
    n3 = 2 if ncol < 256 else 1
    a = _vals(rng, (n3, 3, 4, ncol), t)               # ne (ncol, 4, 3, n3)
    b = np.round(normal(rng, (n3, 3, 2, ncol), 4.0)) if t == Type.I32 else normal(rng, (n3, 3, 2, ncol))
    ix = np.stack([rng.permutation(4)[:2] for _ in range(n3)]).reshape(n3, 1, 2)   # ne (2, 1, n3): over ne2
    yield Sample((Arg(a, t), Arg(b, Type.F32), Arg(ix, Type.I64)), "4-d, indices broadcast over dim 2")
    if not _q_ok(t):
        yield Sample((Arg(a, t, "permuted", (0, 2, 1, 3)), Arg(b, Type.F32, "strided"),
                      Arg(ix, Type.I32, "permuted", (0, 2, 1, 3))), "a permuted, b strided")


def _ref_set_rows(a, b, ix, types):
    dst = Type(types[0])
    if dst.is_quantized:                # the rows are converted into a's type (rows along ne0)
        b = round_trip(b, dst)
    ga, gb, gi = _gg(a).copy(), _gg(b), _gg(ix)
    if ga.dtype.kind in "iu":
        gb = np.trunc(gb).astype(ga.dtype)
    for i3 in range(gb.shape[3]):
        for i2 in range(gb.shape[2]):
            for r in range(gb.shape[1]):
                ga[:, gi[r, i2 % gi.shape[1], i3 % gi.shape[2], 0], i2, i3] = gb[:, r, i2, i3]
    return _np(ga)


# --- diag, pad, pad_reflect_1d, roll, tri, arange ---------------------------------------------

def _diag_samples(rng, t):
    for shape in ((5,), (1, 4), (3, 1, 4), (2, 2, 1, 3)):
        yield Sample((Arg(normal(rng, shape), t),), f"{shape}")
    yield Sample((Arg(normal(rng, (3, 1, 4)), t, "strided"),), "strided")


def _ref_diag(a):
    g = _gg(a)                                         # [n, 1, n2, n3]
    n = g.shape[0]
    out = np.zeros((n, n) + g.shape[2:])
    for i in range(n):
        out[i, i] = g[i, 0]
    return _np(out)


def _pad_samples(rng, t):
    yield Sample((Arg(normal(rng, (3, 4)), t), 2, 1, 0, 0), "2-d")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t), 1, 0, 2, 1), "3-d")
    yield Sample((Arg(normal(rng, (1, 2, 3, 2)), t), 0, 1, 1, 2), "4-d")
    yield Sample((Arg(normal(rng, (3, 4)), t, "transposed"), 1, 2, 0, 0), "transposed")
    yield Sample((Arg(normal(rng, (2, 3, 4, 2)), t, "permuted", (3, 1, 0, 2)), 1, 1, 1, 1), "permuted")


def _ref_pad(a, p0, p1, p2, p3):
    return _ref_pad_ext(a, 0, p0, 0, p1, 0, p2, 0, p3)


def _ref_pad_ext(a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3):
    g = _gg(a)
    lp, rp = (lp0, lp1, lp2, lp3), (rp0, rp1, rp2, rp3)
    ne = [g.shape[i] + lp[i] + rp[i] for i in range(4)]
    out = np.zeros(ne)
    src = tuple(slice(max(0, -lp[i]), g.shape[i] - max(0, -rp[i])) for i in range(4))
    dst = tuple(slice(max(0, lp[i]), ne[i] - max(0, rp[i])) for i in range(4))
    out[dst] = g[src]
    return _np(out)


def _pad_ext_samples(rng, t):
    yield Sample((Arg(normal(rng, (3, 4)), t), 1, 2, 2, 0, 0, 0, 0, 0), "2-d")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t), 0, 1, 1, 1, 2, 0, 0, 0), "3-d")
    yield Sample((Arg(normal(rng, (2, 1, 3, 2)), t), 1, 0, 0, 1, 1, 1, 1, 1), "4-d")
    yield Sample((Arg(normal(rng, (3, 4)), t, "transposed"), 2, 1, 1, 2, 0, 0, 0, 0), "transposed")
    yield Sample((Arg(normal(rng, (3, 5)), t), -1, 2, 1, -1, 0, 0, 0, 0), "negative pads crop")


def _ref_pad_ext_circular(a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3):
    g = _gg(a)
    lp, rp = (lp0, lp1, lp2, lp3), (rp0, rp1, rp2, rp3)
    idx = [np.mod(np.arange(g.shape[i] + lp[i] + rp[i]) - lp[i], g.shape[i]) for i in range(4)]
    return _np(g[np.ix_(*idx)])


def _ref_pad_circular(a, p0, p1, p2, p3):
    return _ref_pad_ext_circular(a, 0, p0, 0, p1, 0, p2, 0, p3)


def _pad_circular_samples(rng, t):
    yield Sample((Arg(normal(rng, (3, 4)), t), 2, 1, 0, 0), "2-d")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t), 5, 7, 1, 0), "pads beyond the extents wrap again")
    yield Sample((Arg(normal(rng, (1, 2, 3, 2)), t), 0, 1, 1, 2), "4-d")
    yield Sample((Arg(normal(rng, (3, 4)), t, "transposed"), 1, 2, 0, 0), "transposed")


def _pad_ext_circular_samples(rng, t):
    yield Sample((Arg(normal(rng, (3, 4)), t), 1, 2, 2, 0, 0, 0, 0, 0), "2-d")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t), 4, 9, 3, 1, 2, 2, 0, 0), "left pads of the extent, right beyond")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t, "permuted", (1, 0, 2, 3)), 0, 1, 1, 1, 1, 0, 0, 0), "permuted")
    yield Sample((Arg(normal(rng, (1, 4)), t), 0, 0, 3, 2, 0, 0, 0, 0), "a unit axis wraps onto itself")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t), 5, 0, 0, 0, 0, 0, 0, 0), "left pad 5 > ne0 = 4",
                 defect="pad-circular-left-oob")


def _pad_reflect_samples(rng, t):
    yield Sample((Arg(normal(rng, (3, 6)), t), 2, 3), "2-d")
    yield Sample((Arg(normal(rng, (2, 3, 5)), t), 4, 0), "left only, the most")
    yield Sample((Arg(normal(rng, (7,)), t), 0, 6), "right only")
    yield Sample((Arg(normal(rng, (2, 1, 2, 4)), t), 1, 1), "4-d")


def _ref_pad_reflect(a, p0, p1):
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(p0, p1)], mode="reflect")


def _roll_samples(rng, t):
    yield Sample((Arg(normal(rng, (3, 5)), t), 2, -1, 0, 0), "2-d")
    yield Sample((Arg(normal(rng, (2, 3, 4, 5)), t), -4, 3, 1, -1), "4-d")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t), 0, 0, 0, 0), "no shift")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t, "strided"), 1, 2, -1, 0), "strided rows")
    yield Sample((Arg(normal(rng, (2, 3, 4, 5)), t, "permuted", (0, 2, 3, 1)), 3, -2, 1, 1), "permuted")


def _ref_roll(a, s0, s1, s2, s3):
    g = _gg(a)
    return _np(np.roll(g, (s0, s1, s2, s3), axis=(0, 1, 2, 3)))


def _tri_samples(rng, t):
    for k in range(4):
        yield Sample((Arg(normal(rng, (4, 4)), t), k), f"type {k}")
        yield Sample((Arg(normal(rng, (2, 3, 5, 5)), t), k), f"4-d, type {k}")
    yield Sample((Arg(normal(rng, (1, 1)), t), 1), "1x1 strict")


def _ref_tri(a, k):
    return {0: np.triu(a), 1: np.triu(a, 1), 2: np.tril(a), 3: np.tril(a, -1)}[int(k)]


def _arange_samples(rng, t):
    for args in ((0.0, 10.0, 1.0), (-3.0, 2.0, 0.5), (1.5, 2.0, 0.3), (0.0, 1.0, 2.0), (-1.0, 100.0, 7.25)):
        yield Sample(args, f"{args}")


def _ref_arange(start, stop, step):
    f = np.float32
    n = int(np.ceil((f(stop) - f(start)) / f(step)))  # the count as ggml computes it, in float32
    return start + step * np.arange(n, dtype=np.float64)


# --- win_part, win_unpart ---------------------------------------------------------------------

def _win_part_samples(rng, t):
    yield Sample((Arg(normal(rng, (6, 4, 3)), t), 2), "W=4 H=6 by 2, no padding")
    yield Sample((Arg(normal(rng, (5, 7, 2)), t), 3), "W=7 H=5 by 3, padded")
    yield Sample((Arg(normal(rng, (3, 3, 4)), t), 4), "one window bigger than the image")
    yield Sample((Arg(normal(rng, (2, 5, 1)), t), 1), "w = 1")


def _ref_win_part(a, w):
    h, wd, c = a.shape[-3:] if a.ndim >= 3 else (1,) + a.shape
    a3 = a.reshape(h, wd, c)
    npx, npy = -(-wd // w), -(-h // w)
    out = np.zeros((npx * npy, w, w, c))
    for py in range(npy):
        for px in range(npx):
            blk = a3[py * w:(py + 1) * w, px * w:(px + 1) * w]
            out[py * npx + px, :blk.shape[0], :blk.shape[1]] = blk
    return out


def _win_unpart_samples(rng, t):
    yield Sample((Arg(normal(rng, (4, 2, 2, 3)), t), 4, 4, 2), "4 windows of 2 into 4x4")
    yield Sample((Arg(normal(rng, (6, 3, 3, 2)), t), 7, 5, 3), "6 windows of 3 into 7x5 (cropped)")
    yield Sample((Arg(normal(rng, (2, 3, 3, 2)), t), 5, 3, 3), "only the windows needed")
    yield Sample((Arg(normal(rng, (3, 4, 4, 2)), t), 5, 2, 3), "windows larger than w: their top-left w x w")


def _ref_win_unpart(a, w0, h0, w):
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)   # (n, ne2, ne1, C)
    npx = -(-w0 // w)
    out = np.empty((h0, w0, a4.shape[3]))
    for i2 in range(h0):
        for i1 in range(w0):
            out[i2, i1] = a4[(i2 // w) * npx + i1 // w, i2 % w, i1 % w]
    return out


# --------------------------------------------------------------------------------------------

_ident = lambda a: a  # noqa: E731
_PLAIN_Q = MOVABLE + (Type.Q8_0, Type.Q4_0)
_BYTES_UNSAMPLED = unsampled(QUANTIZED, BYTES_WHY, sampled=_PLAIN_Q)
_CONCAT_TYPES = MOVABLE + (Type.Q8_0,)


def _into(sampled) -> dict[Type, str]:
    """the quantized types the CPU quantizer writes (cpy, cast, set_rows into them) that
    are not ``sampled`` as the destination"""
    return {**unsampled((t for t in QUANTIZED if t.has_cpu_from_float), CONVERT_WHY, sampled=sampled),
            **unsampled((t for t in DOT_ONLY if t.has_cpu_from_float), DOT_ONLY_WHY),
            **unsampled((t for t in QUANTIZED if t.name == "IQ4_NL"), IQ4_NL_WHY)}


# cpy and cast: the slow types are taken as sources (into F32) too
_CAST_UNSAMPLED = {**unsampled(SLOW_TO_QUANTIZE, SLOW_WHY), **_into(_CPY_TYPES)}


OPINFOS = [
    OpInfo("dup", ref=_ident, samples=_copy_samples, types=_PLAIN_Q, grad=True, unsampled=_BYTES_UNSAMPLED),
    OpInfo("dup_inplace", ref=_ident, samples=_copy_samples, types=_PLAIN_Q, unsampled=_BYTES_UNSAMPLED),
    OpInfo("cont", ref=_ident, samples=_copy_samples, types=_PLAIN_Q, grad=True, unsampled=_BYTES_UNSAMPLED,
           note="quantized sources keep dim 0 in place (a transposed block type has no meaning); a quantized "
                "non-contiguous source reshaped into a contiguous result hits the proposed defect "
                "cpy-quantized-reshape-oob, not sampled until rules_layout.c refuses it"),
    OpInfo("cont_1d", ref=_ref_cont_nd, samples=_cont_nd_samples(1), types=_PLAIN_Q, grad=True,
           unsampled=_BYTES_UNSAMPLED),
    OpInfo("cont_2d", ref=_ref_cont_nd, samples=_cont_nd_samples(2), types=_PLAIN_Q, grad=True,
           unsampled=_BYTES_UNSAMPLED),
    OpInfo("cont_3d", ref=_ref_cont_nd, samples=_cont_nd_samples(3), types=_PLAIN_Q, grad=True,
           unsampled=_BYTES_UNSAMPLED),
    OpInfo("cont_4d", ref=_ref_cont_nd, samples=_cont_nd_samples(4), types=_PLAIN_Q, grad=True,
           unsampled=_BYTES_UNSAMPLED),
    OpInfo("repeat", ref=lambda a, b: tile_to(a, b.shape), samples=_repeat_samples, types=_REPEAT_TYPES, grad=True,
           unsampled=unsampled(QUANTIZED, SHAPE_WHY)),
    OpInfo("repeat_4d", ref=_ref_repeat_4d, samples=_repeat_4d_samples, types=_REPEAT_TYPES, grad=True),
    OpInfo("concat", ref=_ref_concat, samples=_concat_samples, types=_CONCAT_TYPES,
           unsampled=unsampled(QUANTIZED, BYTES_WHY, sampled=_CONCAT_TYPES)),
    OpInfo("set", ref=_place, samples=_set_samples, types=(Type.F32, Type.I32), grad=True),
    OpInfo("set_inplace", ref=_place, samples=_set_samples, types=(Type.F32, Type.I32)),
    OpInfo("set_1d", ref=_ref_set_1d, samples=_set_1d_samples, types=(Type.F32, Type.I32), grad=True),
    OpInfo("set_1d_inplace", ref=_ref_set_1d, samples=_set_1d_samples, types=(Type.F32, Type.I32)),
    OpInfo("set_2d", ref=_ref_set_2d, samples=_set_2d_samples, types=(Type.F32, Type.I32), grad=True),
    OpInfo("set_2d_inplace", ref=_ref_set_2d, samples=_set_2d_samples, types=(Type.F32, Type.I32)),
    OpInfo("cpy", ref=_ref_cpy, samples=_cpy_samples, types=_CPY_TYPES, grad=True, typed_ref=True, tol=CONVERT_TOL,
           unsampled=_CAST_UNSAMPLED,
           note="the sample type is the destination's; " + CONVERT_NOTE),
    OpInfo("cast", ref=lambda a, typ: _ref_convert(a, a.shape, Type(typ)),
           samples=_cast_samples, types=_CPY_TYPES, grad=True, tol=CONVERT_TOL,
           unsampled={t: w for t, w in _CAST_UNSAMPLED.items() if t not in DOT_ONLY},
           note="the sample type is the result's; F32 -> I32 truncates toward 0; " + CONVERT_NOTE),
    OpInfo("reshape", ref=lambda a, b: a.reshape(b.shape), samples=_reshape_samples, types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("reshape_1d", ref=_ref_cont_nd, samples=_reshape_nd_samples(1), types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("reshape_2d", ref=_ref_cont_nd, samples=_reshape_nd_samples(2), types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("reshape_3d", ref=_ref_cont_nd, samples=_reshape_nd_samples(3), types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("reshape_4d", ref=_ref_cont_nd, samples=_reshape_nd_samples(4), types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("view_1d", ref=_ref_view, samples=_view_samples(1), types=_VIEW_TYPES, grad=True, typed_ref=True,
           note="byte offsets and strides scaled to the element size"),
    OpInfo("view_2d", ref=_ref_view, samples=_view_samples(2), types=_VIEW_TYPES, grad=True, typed_ref=True),
    OpInfo("view_3d", ref=_ref_view, samples=_view_samples(3), types=_VIEW_TYPES, grad=True, typed_ref=True),
    OpInfo("view_4d", ref=_ref_view, samples=_view_samples(4), types=_VIEW_TYPES, grad=True, typed_ref=True),
    OpInfo("permute", ref=_ref_permute, samples=_permute_samples, types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("transpose", ref=lambda a: np.swapaxes(a, -1, -2), samples=_transpose_samples, types=MOVABLE, grad=True,
           unsampled=unsampled(QUANTIZED, VIEW_WHY)),
    OpInfo("get_rows", ref=_ref_get_rows, samples=_get_rows_samples, types=_GET_ROWS_TYPES, grad=True,
           unsampled=unsampled(SLOW_TO_QUANTIZE, SLOW_WHY),
           note="the gradient is checked on 2-d samples: ggml's get_rows_back takes matrices only"),
    OpInfo("set_rows", ref=_ref_set_rows, samples=_set_rows_samples, types=_SET_ROWS_TYPES, typed_ref=True,
           tol=CONVERT_TOL,
           unsampled=_into(_SET_ROWS_TYPES),
           note="the sample type is the destination's; " + CONVERT_NOTE),
    OpInfo("diag", ref=_ref_diag, samples=_diag_samples),
    OpInfo("pad", ref=_ref_pad, samples=_pad_samples),
    OpInfo("pad_ext", ref=_ref_pad_ext, samples=_pad_ext_samples),
    OpInfo("pad_circular", ref=_ref_pad_circular, samples=_pad_circular_samples),
    OpInfo("pad_ext_circular", ref=_ref_pad_ext_circular, samples=_pad_ext_circular_samples),
    OpInfo("pad_reflect_1d", ref=_ref_pad_reflect, samples=_pad_reflect_samples),
    OpInfo("roll", ref=_ref_roll, samples=_roll_samples),
    OpInfo("tri", ref=_ref_tri, samples=_tri_samples),
    OpInfo("arange", ref=_ref_arange, samples=_arange_samples),
    OpInfo("win_part", ref=_ref_win_part, samples=_win_part_samples,
           note="no gradient check: ggml_compute_backward routes WIN_PART into its UNARY case"),
    OpInfo("win_unpart", ref=_ref_win_unpart, samples=_win_unpart_samples,
           note="no gradient check: ggml_compute_backward routes WIN_UNPART into its UNARY case"),
]
