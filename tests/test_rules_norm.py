"""Both sides of the kernel rules of the [norm] family (pyggml/csrc/rules_norm.c).

For each refusal clause: pyggml raises the right class at the op call, and the same node
built with the rules off shows that the CPU kernel really fails on it (kernel_verdict:
"abort" or "out-of-bounds") or silently computes wrong values. The accepted side is the
op-information registry's samples (tests/test_opinfo.py).

Clauses no Python call can reach (the builder already refuses, or makes the node so that
the clause holds) are listed in UNREACHABLE with the reason.
"""

import os

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo.harness import kernel_verdict
from rules_helpers import T, X, X16, refused_at_call as _refused, rules_off_values as _rules_off_values

UNREACHABLE = {
    "NORM, RMS_NORM, GROUP_NORM, L2_NORM: result rows/shape/type": "the builders make the result "
    "(a new contiguous tensor, or a view of src0 for _inplace) of the shape and type the kernel needs",
}


# --- refused, and the kernel aborts or leaves its tensors ------------------------------------

CASES = [
    # (id, build, class, match, verdict)
    ("norm f16", lambda c: pyggml.norm(c, c.from_numpy(X16), 1e-5),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("norm eps < 0", lambda c: pyggml.norm(c, c.from_numpy(X), -1e-5),
     pyggml.KernelPreconditionError, "eps must be >= 0", "abort"),
    ("norm eps nan", lambda c: pyggml.norm(c, c.from_numpy(X), float("nan")),
     pyggml.KernelPreconditionError, "eps must be >= 0", "abort"),
    ("norm_inplace eps < 0", lambda c: pyggml.norm_inplace(c, c.from_numpy(X), -1.0),
     pyggml.KernelPreconditionError, "eps must be >= 0", "abort"),
    ("rms_norm f16", lambda c: pyggml.rms_norm(c, c.from_numpy(X16), 1e-5),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("rms_norm transposed", lambda c: pyggml.rms_norm(c, T(c, c.from_numpy(X)), 1e-5),
     pyggml.KernelPreconditionError, "src0 must have contiguous rows", "abort"),
    ("rms_norm_inplace transposed", lambda c: pyggml.rms_norm_inplace(c, T(c, c.from_numpy(X)), 1e-5),
     pyggml.KernelPreconditionError, "src0 must have contiguous rows", "abort"),
    ("rms_norm eps < 0", lambda c: pyggml.rms_norm(c, c.from_numpy(X), -1e-5),
     pyggml.KernelPreconditionError, "eps must be >= 0", "abort"),
    ("group_norm f16", lambda c: pyggml.group_norm(c, c.from_numpy(X16), 1, 1e-5),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("group_norm transposed", lambda c: pyggml.group_norm(c, T(c, c.from_numpy(X)), 1, 1e-5),
     pyggml.KernelPreconditionError, "src0 must have contiguous rows", "abort"),
    ("group_norm 0 groups", lambda c: pyggml.group_norm(c, c.from_numpy(X), 0, 1e-5),
     pyggml.KernelPreconditionError, "n_groups must be >= 1", "abort"),          # SIGFPE
    ("l2_norm f16", lambda c: pyggml.l2_norm(c, c.from_numpy(X16), 1e-5),
     pyggml.GGMLTypeError, "does not take src0 of type f16", "abort"),
    ("l2_norm eps < 0", lambda c: pyggml.l2_norm(c, c.from_numpy(X), -1.0),
     pyggml.KernelPreconditionError, "eps must be >= 0", "abort"),
]


@pytest.mark.parametrize("build, cls, match, verdict", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_and_the_kernel_fails(build, cls, match, verdict):
    _refused(build, cls, match)
    assert kernel_verdict(build) == verdict


# --- refused, and the kernel computes wrong values -------------------------------------------

def test_group_norm_negative_groups_leaves_the_result_unwritten():
    build = lambda c: pyggml.group_norm_inplace(c, c.from_numpy(X), -1, 1e-5)
    _refused(build, pyggml.KernelPreconditionError, "n_groups must be >= 1")
    assert kernel_verdict(build) == "ok"
    assert np.array_equal(_rules_off_values(build), X)            # not normalized: untouched


def test_group_norm_overflowing_groups_refused():
    _refused(lambda c: pyggml.group_norm(c, c.from_numpy(X), 2**31 - 2, 1e-5),
             pyggml.KernelPreconditionError, "overflows the kernel's int arithmetic")


@pytest.mark.skipif(not os.environ.get("PYGGML_SLOW"), reason="about 10 s: 2^31 iterations of the kernel's loop")
def test_group_norm_overflowing_groups_leaves_the_result_unwritten():
    build = lambda c: pyggml.group_norm_inplace(c, c.from_numpy(X), 2**31 - 2, 1e-5)
    assert np.array_equal(_rules_off_values(build), X)


# --- accepted: what the samples do not show --------------------------------------------------

# argsort ([reduce]) is checked here too, in one test item kept whole
def test_rms_norm_empty_and_f16_is_not_refused():
    """An empty node runs no kernel (ggml_compute_forward skips it) unless RMS_NORM is fused
    with a following MUL, which needs an F32 src0: an empty F16 RMS_NORM is accepted."""
    with pyggml.Context(1 << 20) as ctx:
        pyggml.rms_norm(ctx, ctx.new_tensor(Type.F16, (4, 0, 1, 1)), 1e-5)
        pyggml.argsort(ctx, ctx.new_tensor(Type.F16, (4, 0, 1, 1)), pyggml.SortOrder.ASC)
        # no kernel reads eps either: an empty node is accepted whatever its params
        pyggml.rms_norm(ctx, ctx.new_tensor(Type.F32, (4, 0, 1, 1)), -1.0)
        with pytest.raises(pyggml.KernelPreconditionError, match="eps must be >= 0"):
            pyggml.rms_norm(ctx, ctx.new_tensor(Type.F32, (4, 1, 1, 1)), -1.0)
