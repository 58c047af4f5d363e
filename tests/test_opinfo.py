"""Every op against its float64 reference, and ggml's autodiff against central
differences, driven by the op-information registry (pyggml.opinfo).

The default run takes every sample of every type each OpInfo declares; the gradient
check runs on the F32 samples of ops with a backward in ggml (the first few).
"""

import dataclasses
import math
import os
import warnings
import zlib

import numpy as np
import pytest

import pyggml
from pyggml import _optable
from pyggml.opinfo import registry
from pyggml.opinfo.harness import compute, grad_check, run

REG = registry()
# samples are drawn from seeds fixed per op and type; PYGGML_SEED picks another set
BASE_SEED = int(os.environ.get("PYGGML_SEED", "0"))


def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode()) ^ BASE_SEED
ROWS = {r["name"]: r for r in _optable.OPS}


def _callable(name) -> bool:
    """the builder is bound here (ggml's, or pyggml's own for an impl=pyggml row)"""
    return ROWS[name]["available"]
MAX_GRAD_SAMPLES = 3


def _cases():
    for name, info in sorted(REG.items()):
        for t in info.types:
            rng = np.random.default_rng(_seed(name, t.name))
            for i, s in enumerate(info.samples(rng, t)):
                yield pytest.param(info, t, s, id=f"{name}-{t.name}-{i}")


def _grad_cases():
    for name, info in sorted(REG.items()):
        if not info.grad:
            continue
        rng = np.random.default_rng(_seed(name, "grad"))
        picked = [s for s in info.samples(rng, pyggml.Type.F32)
                  if all(a.layout == "contiguous" for a in s.args if isinstance(a, pyggml.opinfo.Arg))
                  and not s.defect]
        # the first few, and every one that hits a known defect of the backward pass
        picked = picked[:MAX_GRAD_SAMPLES] + [s for s in picked[MAX_GRAD_SAMPLES:] if s.grad_defect]
        for i, s in enumerate(picked):
            yield pytest.param(info, s, id=f"{name}-{i}")


def test_every_op_in_the_registry_is_a_bound_row():
    for name in REG:
        # (whether this ggml has it: tests/test_optable.py; samples of a missing one skip)
        assert name in ROWS and "unbound" not in ROWS[name]["flags"], name


@pytest.mark.parametrize("info, t, sample", list(_cases()))
def test_op_matches_reference(info, t, sample):
    if not _callable(info.op):
        pytest.skip(ROWS[info.op]["reason"])
    if sample.defect:
        with pytest.raises(pyggml.UpstreamDefect) as e:
            run(info, sample)
        assert e.value.defect == sample.defect
        return
    res = run(info, sample)
    want = ROWS[info.op]["makes"]
    assert res.op == want or (want.endswith(":*") and res.op.startswith(want[:-1])), \
        f"the result's op is {res.op}, the table says {want}"
    tol = info.tolerance(t)
    assert res.nmse <= tol, (f"{info.op} {sample.name}: NMSE {res.nmse:.3e} > {tol:.0e} "
                             f"(max abs {res.max_abs:.3e})")


@pytest.mark.parametrize("info, sample", list(_grad_cases()))
def test_autodiff_matches_central_differences(info, sample):
    if sample.grad_defect:
        with pytest.raises(pyggml.UpstreamDefect) as e:
            grad_check(info, sample)
        assert e.value.defect == sample.grad_defect
        return
    errs = grad_check(info, sample)
    bad = {i: e for i, e in errs.items() if not e <= info.grad_tol}
    assert not bad, f"{info.op} {sample.name}: gradient NMSE {bad} > {info.grad_tol:.0e}"
    assert all(math.isfinite(e) for e in errs.values())


# --- an op's types are stated once, in its kernel rule: the OpInfo must agree ----------------
# the float and integer types (quantized ones need whole blocks, which a re-typed sample
# does not have: they are not checked here)

CHECKED_TYPES = (pyggml.Type.F32, pyggml.Type.F16, pyggml.Type.BF16, pyggml.Type.I32, pyggml.Type.I16,
                 pyggml.Type.I8)


def unlisted_types_taken(info) -> list[str]:
    """The float and integer types outside ``info.types`` that pyggml lets through to a compute.

    For each such type, the first sample the sampler draws for it (a sampler that ignores
    its type argument gets its tensor args re-typed) must be refused before it computes:
    GGMLTypeError (a kernel rule), GGMLAbort (the builder's own GGML_ASSERT on the type)
    or UpstreamDefect (a known defect of that type). A type computed is a type the kernel
    takes that the OpInfo neither lists nor samples."""
    taken = []
    for t in CHECKED_TYPES:
        if t in info.types:
            continue
        rng = np.random.default_rng(_seed(info.op, t.name))
        sample = next(s for s in info.samples(rng, t) if not s.defect)
        if not any(isinstance(a, pyggml.opinfo.Arg) and a.type == t for a in sample.args):
            sample = dataclasses.replace(sample, args=tuple(
                dataclasses.replace(a, type=t) if isinstance(a, pyggml.opinfo.Arg) else a for a in sample.args))
        if not any(isinstance(a, pyggml.opinfo.Arg) for a in sample.args):
            continue                    # no tensor argument (arange): the type is not the caller's
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                compute(info, sample)
        except (pyggml.GGMLTypeError, pyggml.GGMLAbort, pyggml.UpstreamDefect):
            continue
        taken.append(t.name)
    return taken


@pytest.mark.parametrize("name", sorted(n for n in REG if ROWS[n]["available"]))
def test_every_type_the_kernel_takes_is_in_the_opinfo(name):
    assert unlisted_types_taken(REG[name]) == []


def test_an_unlisted_type_the_kernel_takes_fails():
    # mul_mat's rule takes F16 and BF16 a: an OpInfo that lists F32 only is caught
    narrowed = dataclasses.replace(REG["mul_mat"], types=(pyggml.Type.F32,))
    assert unlisted_types_taken(narrowed) == ["F16", "BF16"]
