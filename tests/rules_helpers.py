"""What every tests/test_rules_<family>.py needs, once: a refusal asserted with its class,
message and defect id, and a node's values computed with pyggml's rules off; below them,
the inputs and checks that several family files share."""

import re

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo.harness import kernel_verdict, read, rules_disabled
from pyggml.opinfo._common import kernel_before, kernel_since  # noqa: F401 (for the rule tests)

SCRATCH = 64 << 20          # one context size for every rule test's builds


def refused(build, cls, match, defect=None):
    """``build(ctx)`` raises ``cls`` matching ``match``; an UpstreamDefect carries the id
    ``defect``, and a refusal that is not about a defect is not an UpstreamDefect.
    Returns the exception."""
    with pyggml.Context(SCRATCH) as ctx:
        with pytest.raises(cls, match=match) as e:
            build(ctx)
    if defect is not None:
        assert e.value.defect == defect
    elif not issubclass(cls, pyggml.UpstreamDefect):
        assert not isinstance(e.value, pyggml.UpstreamDefect), e.value
    return e.value


def computed(ctx, t, n_threads=1):
    """t's values after computing its graph, as float64 whatever its type (harness.read:
    BF16 and quantized results dequantized)"""
    g = pyggml.Graph(ctx, 64)
    g.build_forward_expand(t)
    g.compute(n_threads)
    return read(t)


def compute_unchecked(build, n_threads=1):
    """The values of ``build(ctx)``'s node computed with the rules off (the graph is
    proven first: a refusal the proof turns into an exception is not a wrong value)."""
    with rules_disabled(), pyggml.Context(SCRATCH) as ctx:
        return computed(ctx, build(ctx), n_threads)


# --- refusing and computing: [math], [activation], [glu], [reduce], [norm] ----------------------

# Newer ggml (0.25.3; not 0.20.2) asserts in ggml_new_tensor that a tensor's element count
# fits int64: there the builder itself aborts (in pyggml's abort guard) before pyggml's own
# shape check sees the node. Either is a refusal with its reason; nothing is built.
NEW_TENSOR_SIZE_ASSERT = r"ggml would abort: ggml\.c:\d+: GGML_ASSERT\(INT64_MAX / ne\[i\] > current_nelements\)"


def refused_size(build, match):
    """build() is refused for a result size past int64: KernelPreconditionError matching
    ``match`` (pyggml's shape check), or, where the linked ggml checks that itself,
    the builder's own assertion (GGMLAbort); returns the exception."""
    with pytest.raises((pyggml.KernelPreconditionError, pyggml.GGMLAbort)) as e:
        build()
    if isinstance(e.value, pyggml.KernelPreconditionError):
        assert re.search(match, str(e.value)), (match, str(e.value))
    else:
        assert re.search(NEW_TENSOR_SIZE_ASSERT, str(e.value)), str(e.value)
    return e.value


def refused_at_call(build, cls, match):
    """pyggml refuses the node at the op call, with cls (nothing more is checked)"""
    with pyggml.Context(16 << 20) as ctx:
        with pytest.raises(cls, match=match):
            build(ctx)


def refused_verdict(build, cls, match):
    """pyggml refuses the node at the op call, with cls; the kernel itself, rules off: its verdict"""
    refused_at_call(build, cls, match)
    return kernel_verdict(build)


def untrusted(op):
    """op's CPU kernel in the linked ggml is not the one pyggml's rule was written against
    (a changed kernel, or a prebuilt ggml whose kernels are unknown)"""
    return op in pyggml._core.kernel_trust()["untrusted"]


def refused_where_kernel_aborts(build, cls, match, op, since=None):
    """Both sides of a refusal clause that stands for the kernel's own abort (csrc
    pg_kernel_aborts). Where ``op``'s kernel is the one the rule was written against,
    pyggml refuses the node at the op call with ``cls``, and the kernel, rules off,
    aborts: returns None. Where a review of release ``since`` or later found that the
    kernel takes the node (the clause is lifted there: pg_kernel_since), the node builds,
    no proof, and computes: its values (float64). Where the kernel changed, unreviewed,
    the rule does not refuse: the node builds and its graph's proof decides. A kernel that
    still aborts is refused at compute with its own message (GGMLAbort, the process
    alive): None; one that computes the node: its values, for the test to compare with a
    reference."""
    if since is not None and kernel_since(op, since):
        with pyggml.Context(SCRATCH) as ctx:
            t = build(ctx)
            g = pyggml.Graph(ctx, 64)
            g.build_forward_expand(t)
            assert g.unchecked_ops == 0, g.unchecked_ops      # the rule vouches for it: no proof
            g.compute(1)
            return read(t)
    if not untrusted(op):
        refused_at_call(build, cls, match)
        # a trusted kernel the clause applies to aborts: else the refusal is a false one
        assert kernel_verdict(build) == "abort"
        return None
    with pyggml.Context(SCRATCH) as ctx:
        t = build(ctx)
        try:
            return computed(ctx, t)
        except pyggml.GGMLAbort as e:
            assert not isinstance(e, pyggml.UpstreamDefect), e      # an abort, not a read out of bounds
            return None


def compute(ctx, t, n_threads=1):
    """t's values (a copy, in t's dtype) after computing its graph"""
    g = pyggml.Graph(ctx, 64)
    g.build_forward_expand(t)
    g.compute(n_threads)
    return t.numpy().copy()


def compute_f64(ctx, t, n_threads=1):
    """t's values as float64 after computing its graph"""
    return compute(ctx, t, n_threads).astype(np.float64)


def rules_off_values(build, n_threads=1):
    """The node's values computed with the rules off (its graph proven first, in a guarded
    child: only for nodes whose kernel neither aborts nor leaves its tensors)."""
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        return compute(ctx, build(ctx), n_threads)


# --- inputs of the [math], [activation] and [glu] rule tests -----------------------------------

def have(enum, name):
    return hasattr(enum, name)


def f32_randn(ctx, shape, seed=0):
    return ctx.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def bf16_zeros(ctx, shape):
    return ctx.from_numpy(np.zeros(shape, np.uint16), type=Type.BF16)


def column(ctx, n=4, dtype=np.float32):
    """ne = (1, n), nb[0] = 4n bytes: the transpose of one row. ggml_is_contiguous_rows (and so
    the builder ggml_unary_impl) takes it: a row of one element."""
    x = (np.arange(n, dtype=np.float64) - 1.5).reshape(1, n).astype(dtype)
    return pyggml.transpose(ctx, ctx.from_numpy(x))


def transposed_f32(ctx, rows=4, cols=6):
    return pyggml.transpose(ctx, f32_randn(ctx, (rows, cols)))


def dims12_swapped(ctx):
    """rows contiguous, dims 1 and 2 swapped: not ggml_is_contiguous_1"""
    return pyggml.permute(ctx, f32_randn(ctx, (2, 3, 4, 6)), 0, 2, 1, 3)


def unary_values(fn, x, dtype=np.float32):
    """fn(ctx, x) computed (rules on), as float64"""
    with pyggml.Context(1 << 20) as ctx:
        return compute_f64(ctx, fn(ctx, ctx.from_numpy(np.asarray(x, dtype))))


# --- inputs of the [reduce] and [norm] rule tests ------------------------------------------------

T = pyggml.transpose
X = np.random.default_rng(1234).standard_normal((3, 4, 5)).astype(np.float32)       # ne (5, 4, 3)
X16 = X.astype(np.float16)


# --- inputs and verdicts of the [matmul], [train] and [backward] rule tests --------------------

KPE = pyggml.KernelPreconditionError
TYPE_ERR = pyggml.GGMLTypeError
FAILS = ("abort", "out-of-bounds")


def refused_and_kernel_fails(build, exc, match, defect):
    """Both sides of one refusal clause: ``build(ctx)`` raises ``exc`` matching
    ``match`` (with the defect id ``defect``, if any), and the same node with the rules
    off makes the CPU kernel abort or go out of bounds."""
    with pyggml.Context(16 << 20) as ctx:
        with pytest.raises(exc, match=match) as e:
            build(ctx)
    if defect:
        assert e.value.defect == defect
    assert kernel_verdict(build) in FAILS
F16, BF16 = Type.F16, Type.BF16


def rnd(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t_(ctx, x, typ=Type.F32):
    """a tensor of x's values (numpy order) stored as typ"""
    x = np.asarray(x)
    if typ == Type.F32:
        return ctx.from_numpy(x.astype(np.float32))
    if typ == Type.F16:
        return ctx.from_numpy(x.astype(np.float16))
    if typ == Type.I32:
        return ctx.from_numpy(x.astype(np.int32))
    if typ == Type.BF16:
        q = pyggml.quantize(typ, x.astype(np.float32).reshape(-1, x.shape[-1]))
        return ctx.from_numpy(q.view(np.uint16).reshape(x.shape), type=typ)
    return ctx.from_numpy(pyggml.quantize(typ, x.astype(np.float32)), type=typ)


def tr(ctx, x, typ=Type.F32):
    """x (numpy order) as the transpose of a contiguous tensor: rows not contiguous"""
    return pyggml.transpose(ctx, t_(ctx, np.ascontiguousarray(np.swapaxes(x, -1, -2)), typ))


def strided_vector(ctx, values, dtype=np.float32):
    """a vector whose elements are 8 bytes apart (ne0 = n, nb0 = 8): every other element
    of a base [2, n]; the elements in between are 99"""
    n = len(values)
    base = np.full((n, 2), 99, dtype)
    base[:, 0] = values
    b = ctx.from_numpy(base)
    return pyggml.transpose(ctx, pyggml.view_2d(ctx, b, 1, n, b.nb[1], 0))


def unwalkable(ctx, values):
    """a [3, 1, 2] F32 view that ggml_is_contiguous calls contiguous (ne1 = 1: nb1 is not
    looked at) but whose rows are not nb1 apart: row 1 at byte 12, nb1 = 32"""
    base = np.full(16, 7.0, np.float32)
    base[:6] = np.asarray(values, np.float32).reshape(-1)
    b = ctx.from_numpy(base)
    v = pyggml.view_3d(ctx, b, 3, 1, 2, 32, 12, 0)
    assert v.shape == (2, 1, 3)
    return v
