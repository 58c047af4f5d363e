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
from pyggml.opinfo._common import DOT_ONLY, QUANTIZED, SLOW_TO_QUANTIZE
from pyggml.opinfo.harness import compute, grad_check, kernels_trusted, run

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
    takes that the OpInfo neither lists nor samples. The rules decide as written
    (kernels_trusted: on a ggml whose kernel changed, a refusal that stands for the old
    kernel's abort would otherwise go to the proof, and the check would measure the new
    kernel, not the rule), and each compute is proven first."""
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
            with warnings.catch_warnings(), kernels_trusted():
                warnings.simplefilter("ignore", DeprecationWarning)
                compute(info, sample, prove=True)
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


# --- ... and so must its quantized types -----------------------------------------------------
# A quantized sample needs rows of whole blocks, which the float samples do not have. So the
# check builds (no compute, a no_alloc context) the op's first contiguous sample of its first
# type with every float tensor's rows 256 times as long (whole blocks of every quantized
# type), once as it is and then with each float tensor in turn, and all of them together,
# re-typed to each quantized type: a type some re-typing builds is a type pyggml's rule lets
# through to the kernel, and must be in the OpInfo's ``types`` or ``unsampled``.

WIDEN = 256
FLOAT_TYPES = (pyggml.Type.F32, pyggml.Type.F16, pyggml.Type.BF16)
# ops whose sample cannot be widened: the check cannot see their quantized types
QUANTIZED_UNCHECKED = {
    # its builder asserts 4 hyper-connections (mixes' and base's rows of 24, scale's of 3: no
    # quantized block fits) and every type F32 (ggml.c, ggml_dsv4_hc_comb)
    "dsv4_hc_comb",
    "opt_step_adamw", "opt_step_sgd",               # their samples pass ready tensors
}


def _widen_int(i):
    def widen(args):
        return [a * WIDEN if j == i else a for j, a in enumerate(args)]
    return widen


def _square(args):
    (typ, shape, is_float), *rest = args
    return [(typ, shape[:-2] + (shape[-1], shape[-1]), is_float), *rest]


def _set(args, i, shape=None, retype=None):
    typ, sh, fl = args[i]
    args[i] = (typ, tuple(shape) if shape is not None else sh, fl if retype is None else retype)


def _restore(args, i):
    """args[i] as the sample had it (its rows not widened) and never re-typed: a count, not rows"""
    sh = args[i][1]
    _set(args, i, sh[:-1] + (sh[-1] // WIDEN,), retype=False)


def _restoring(*idx):
    def fix(args):
        args = list(args)
        for i in idx:
            _restore(args, i)
        return args
    return fix


def _add_rel_pos(args):
    args = list(args)
    _set(args, 0, args[0][1][:-1] + (args[1][1][-1] ** 2,))        # a's ne0 = pw's ne0 squared
    return args


def _solve_tri(args):
    args = list(args)
    a, b = args[0][1], args[1][1]
    _set(args, 0, a[:-2] + (a[-1], a[-1]))                          # a square
    _set(args, 1, b[:-2] + (a[-1], b[-1]))                          # b's ne1 is a's
    return args


def _state_s2(i):
    """a recurrent state of S * S * H * n_seqs: S widened, so the state twice"""
    def fix(args):
        args = list(args)
        _set(args, i, args[i][1][:-1] + (args[i][1][-1] * WIDEN,))
        return args
    return fix


def _flash_attn_back(args):
    args = list(args)
    q, k, v = args[0][1], args[1][1], args[2][1]
    M = k[-2] * WIDEN                                               # the keys widened too
    _set(args, 1, k[:-2] + (M, k[-1]))                              # k [D, M]
    _set(args, 2, v[:-2] + (q[-1], M))                              # v [M, D]
    return args


def _gated_delta_net(args):
    args = _restoring(4)(args)                                      # beta: one per head
    S = args[2][1][-1]
    _set(args, 3, args[3][1][:-1] + (S,))                           # the gate per key (KDA)
    _set(args, 5, args[5][1][:-2] + (S, S))                         # the state S x S
    return args


def _ssm_scan(args):
    args = _restoring(2)(args)                                      # dt: one per head
    s, x, A = args[0][1], args[1][1], args[3][1]
    _set(args, 0, s[:-2] + (x[-1], s[-1]))                          # s (slots, heads, head dim as x's, states)
    _set(args, 3, A[:-1] + (s[-1],))                                # A per state (Mamba-1)
    return args


# ops whose widened sample builds once its other arguments follow the wider rows (or keep
# the sample's own size where they are counts: re-typing those is not checked)
WIDEN_ALSO = {
    # the new shape's ne0 (its product must stay a's; repeat's a multiple of a's ne0)
    **{f"{op}_{n}d": _widen_int(1) for op in ("cont", "reshape") for n in (1, 2, 3, 4)},
    "repeat_4d": _widen_int(1),
    "tri": _square,                                 # a square matrix: its rows as long as its columns
    "add_rel_pos": _add_rel_pos, "add_rel_pos_inplace": _add_rel_pos,
    "solve_tri": _solve_tri,
    "rwkv_wkv6": _state_s2(5), "gated_linear_attn": _state_s2(4), "rwkv_wkv7": _state_s2(6),
    "dsv4_hc_pre": _restoring(1),                   # the weights per hyper-connection
    "dsv4_hc_post": _restoring(2, 3),               # post and comb per hyper-connection
    "flash_attn_back": _flash_attn_back,
    "gated_delta_net": _gated_delta_net,
    "lightning_indexer": _restoring(2, 3),          # weights per head, the mask per key
    "ssm_scan": _ssm_scan,
}


def _is_tensor_spec(a) -> bool:
    return isinstance(a, tuple) and len(a) == 3 and isinstance(a[0], pyggml.Type)


def widened_sample(info):
    """The op's first contiguous sample of its first type, as (type, numpy shape, float?)
    per tensor argument, the float ones WIDEN times as long in their rows; None where it
    has none (no tensor argument, or every sample passes ready tensors)."""
    t0 = info.types[0]
    rng = np.random.default_rng(_seed(info.op, "quantized"))
    for s in info.samples(rng, t0):
        tensors = [a for a in s.args if isinstance(a, pyggml.opinfo.Arg)]
        if (s.defect or not tensors or any(isinstance(a, pyggml.Tensor) for a in s.args)
                or any(a.layout != "contiguous" for a in tensors)):
            continue
        args = []
        for a in s.args:
            if not isinstance(a, pyggml.opinfo.Arg):
                args.append(a)
                continue
            typ = pyggml.Type(a.type)
            shape = np.shape(a.value) or (1,)
            is_float = typ in FLOAT_TYPES and int(np.prod(shape)) > 1     # (a scalar stays one)
            if is_float:
                shape = shape[:-1] + (shape[-1] * WIDEN,)
            args.append((typ, shape, is_float))
        return args
    return None


def _builds(op: str, args, retype: dict) -> bool:
    """Whether pyggml builds op on tensors of these types and shapes (a no_alloc context:
    its rules decide, as written, and nothing computes)."""
    with pyggml.Context(1 << 20, no_alloc=True) as ctx, kernels_trusted():
        call = [ctx.new_tensor(retype.get(i, a[0]), tuple(reversed(a[1]))) if _is_tensor_spec(a) else a
                for i, a in enumerate(args)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                getattr(pyggml, op)(ctx, *call)
        except pyggml.GGMLError:
            return False
    return True


def _takes_tensors(info) -> bool:
    rng = np.random.default_rng(_seed(info.op, "quantized"))
    return any(isinstance(a, (pyggml.opinfo.Arg, pyggml.Tensor)) for t in info.types
               for s in info.samples(rng, t) for a in s.args)


def quantized_types_taken(info) -> list[pyggml.Type] | None:
    """The quantized types pyggml's rule lets through for info.op (None: the widened
    sample does not build as it is, so nothing can be said; none for an op that takes
    no tensor)."""
    if not _takes_tensors(info):
        return []
    args = widened_sample(info)
    if args is not None and info.op in WIDEN_ALSO:
        args = WIDEN_ALSO[info.op](args)
    if args is None or not _builds(info.op, args, {}):
        return None
    pos = [i for i, a in enumerate(args) if _is_tensor_spec(a) and a[2]]
    retypings = [[i] for i in pos] + ([pos] if len(pos) > 1 else [])
    return [q for q in QUANTIZED if any(_builds(info.op, args, {i: q for i in r}) for r in retypings)]


def sampled_types(info) -> set:
    """info.types, and every type a tensor argument of its samples has (a source of cpy's
    samples into F32, an F32 b of mul_mat's quantized a, ...)."""
    got = set(info.types)
    for t in info.types:
        for s in info.samples(np.random.default_rng(_seed(info.op, t.name)), t):
            got |= {pyggml.Type(a.type) for a in s.args if isinstance(a, pyggml.opinfo.Arg)}
    return got


@pytest.mark.parametrize("name", sorted(n for n in REG if ROWS[n]["available"]))
def test_every_quantized_type_the_rule_takes_is_in_the_opinfo(name):
    info = REG[name]
    taken = quantized_types_taken(info)
    if taken is None:
        assert name in QUANTIZED_UNCHECKED, f"{name}: its widened sample does not build"
        return
    assert name not in QUANTIZED_UNCHECKED, f"{name} is checked now: take it out of QUANTIZED_UNCHECKED"
    sampled = sampled_types(info)
    assert [q.name for q in taken if q not in sampled and q not in info.unsampled] == []
    # and an unsampled type is one the rule takes (not a stale excuse)
    assert [q.name for q in info.unsampled if q.is_quantized and q not in taken] == []
    assert all(why for why in info.unsampled.values())


def test_an_unlisted_quantized_type_the_rule_takes_fails():
    # get_rows dequantizes every quantized type with a to_float, and no other: an OpInfo
    # that lists the float types only is caught on each of them
    narrowed = dataclasses.replace(REG["get_rows"], types=FLOAT_TYPES, unsampled={})
    taken = quantized_types_taken(narrowed)
    assert taken == [q for q in QUANTIZED if q not in DOT_ONLY] and len(taken) > 20
    assert not set(taken) & sampled_types(narrowed)


# --- the quantized types whose first quantization takes seconds --------------------------------

SLOW_OPS = ("mul_mat", "mul_mat_id", "out_prod", "get_rows", "flash_attn_ext")


@pytest.mark.parametrize("t", SLOW_TO_QUANTIZE, ids=lambda t: t.name)
def test_the_slow_quantized_types_against_float64(t):
    """SLOW_TO_QUANTIZE (their first quantization in a process builds a search grid; three
    need an importance matrix, which the harness makes flat) are left out of the OpInfos'
    ``types``: here, once, the first sample of each op that takes them, against float64
    with the bound of the op's other 256-block type (Q4_K)."""
    assert t.blck_size == pyggml.Type.Q4_K.blck_size
    for op in SLOW_OPS:
        info = REG[op]
        assert t in info.unsampled and t not in info.types
        sample = next(s for s in info.samples(np.random.default_rng(_seed(op, t.name)), t) if not s.defect)
        res = run(info, sample)
        assert res.nmse <= info.tolerance(pyggml.Type.Q4_K), f"{op} {t.name} {sample.name}: NMSE {res.nmse:.2e}"
