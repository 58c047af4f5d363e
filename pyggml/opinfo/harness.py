"""Run an OpInfo sample through ggml and compare it with the float64 reference.

:func:`run` builds the sample's tensors (values rounded to their types the way ggml
stores them; transposed, permuted or strided as the sample says), calls the builder,
computes the graph and returns the result next to the reference. :func:`grad_check`
compares ggml's autodiff with central differences of the reference. Both raise what
pyggml raises (a refusal is an exception, not a result).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import numpy as np

import pyggml
from pyggml import Type
from pyggml.opinfo import Arg, OpInfo, Sample

__all__ = ["Result", "compute", "grad_check", "gradients", "kernel_verdict", "nmse", "reference", "release_abort",
           "rules_cover_the_linked_ggml", "rules_disabled", "run", "stored"]


def rules_cover_the_linked_ggml() -> bool:
    """Whether pyggml's rules were written against every CPU kernel of the linked ggml
    (each kernel's fingerprint is one ``kernels.txt`` names: the pinned release's, or one
    reviewed). There, ggml aborting on a sample the rules let through is a pyggml defect. On
    any other ggml (a prebuilt one, whose kernels cannot be fingerprinted; a tree whose
    kernels changed) no rule is taken on trust: each graph is proven in a forked child first,
    and an abort caught there, or at a builder, is that release's own contract."""
    kernels = pyggml.build_info()["kernels"]
    return bool(kernels["known"]) and not kernels["untrusted"]


def release_abort(e: BaseException) -> str | None:
    """Why ``e`` is the linked release's own refusal of a sample, not a defect of pyggml or
    of ggml (None: it is not): ggml aborting (a builder's or a kernel's ``GGML_ASSERT``,
    caught) on a ggml the rules do not cover (:func:`rules_cover_the_linked_ggml`), or a
    feature this ggml lacks (:class:`pyggml.GGMLVersionError`) on a release other than the
    one pyggml's rules are written against (``build_info()["kernels"]["pinned_release"]``,
    which lacks nothing pyggml offers). A kernel that hangs (:class:`pyggml.KernelTimeout`)
    is never one: it is a defect wherever it is seen."""
    version = pyggml.ggml_version()
    if isinstance(e, pyggml.GGMLVersionError):
        if version == pyggml.build_info()["kernels"]["pinned_release"]:
            return None
        return f"ggml {version} lacks what this sample needs: {e}"
    if isinstance(e, pyggml.GGMLAbort) and not isinstance(e, pyggml.KernelTimeout) \
            and not rules_cover_the_linked_ggml():
        return f"ggml {version} aborts on this sample (caught; its rules and kernels are not pyggml's): {e}"
    return None


@contextlib.contextmanager
def rules_disabled():
    """Within: pyggml's kernel rules are off, so a node any rule would refuse is built,
    and its graph is proven in a guarded forked child (``pyggml._cpu.prove``) instead.
    For testing the rules against the kernels themselves (both sides of each rule)."""
    was = pyggml._core._set_rules_enabled(False)
    try:
        yield
    finally:
        pyggml._core._set_rules_enabled(was)


@contextlib.contextmanager
def kernels_trusted():
    """Within: every op's kernel is trusted to its rule, as on the release the rules were
    written against, so the rules decide as written, whatever kernels the linked ggml has
    (a refusal that stands for the old kernel's abort stays a refusal). For checks of the
    rules themselves (an OpInfo's types against its rule); a graph computed within takes
    no proof for its kernels' sake, so prove it (``compute(..., prove=True)``)."""
    core = pyggml._core
    was = {op: core._set_kernel_untrusted(op, False) for op in pyggml.Op}
    try:
        yield
    finally:
        for op, flag in was.items():
            core._set_kernel_untrusted(op, flag)


def kernel_verdict(build, timeout: float | None = None) -> str:
    """What the CPU kernel itself does with the node ``build(ctx)`` returns, rules off:
    "ok" (ran clean in the guarded child), "abort" (GGMLAbort: an assertion, or a fault
    such as SIGFPE), "out-of-bounds" (a read or write past a tensor) or "hang" (the child
    ran past ``timeout`` seconds, default the proof's own limit). The builder itself may
    still raise (GGMLAbort): then "builder"."""
    with rules_disabled(), pyggml.Context(64 << 20) as ctx:
        try:
            t = build(ctx)
        except pyggml.GGMLAbort:
            return "builder"
        g = pyggml.Graph(ctx, 512)
        g.build_forward_expand(t)
        try:
            pyggml._cpu.prove(g, timeout)
        except pyggml.KernelTimeout:
            return "hang"
        except pyggml.UpstreamDefect:
            return "out-of-bounds"
        except pyggml.GGMLAbort:
            return "abort"
        return "ok"


@dataclasses.dataclass
class Result:
    out: np.ndarray          # ggml's result, float64 (or int), numpy order
    ref: np.ndarray          # the reference, same shape
    nmse: float
    max_abs: float
    op: str                  # the result's op, as the table's `makes` spells it


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    """Σ(out−ref)²/Σref² (test-backend-ops' metric) over the finite entries of ref; inf
    when out and ref disagree on which entries are finite (or on a non-finite value)."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    if not np.array_equal(fin, np.isfinite(out)) or not np.array_equal(out[~fin], ref[~fin]):
        return math.inf
    d = np.sum((out[fin] - ref[fin]) ** 2)
    s = np.sum(ref[fin] ** 2)
    return float(d / s) if s > 0 else float(d)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bits (uint16), with ggml's own rounding."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1] if x.ndim else 1)
    return pyggml.quantize(Type.BF16, flat).view(np.uint16).reshape(x.shape)


def _base(arg: Arg) -> np.ndarray:
    """The values laid out as the tensor that stores them (numpy order): the Arg's own
    values for "contiguous", the source of the transpose, permute or strided view else."""
    v = np.asarray(arg.value)
    if arg.layout == "contiguous":
        return v
    if arg.layout == "transposed":
        if v.ndim < 2:
            raise ValueError("a transposed Arg needs 2 or more dims")
        return np.ascontiguousarray(np.swapaxes(v, -1, -2))
    if arg.layout == "permuted":
        lg = v.reshape((1,) * (4 - v.ndim) + v.shape).transpose(3, 2, 1, 0)        # ggml order
        return np.ascontiguousarray(lg.transpose(arg.perm).transpose(3, 2, 1, 0))  # numpy order
    if arg.layout == "strided":
        if Type(arg.type).is_quantized or v.ndim < 2:
            raise ValueError("a strided Arg needs a plain type and 2 or more dims")
        big = np.zeros(v.shape[:-1] + (2 * v.shape[-1],))
        big[..., :v.shape[-1]] = v
        return big
    raise ValueError(f"unknown layout {arg.layout!r}")


def _raw(arg: Arg) -> tuple[np.ndarray, Type | None]:
    """What from_numpy gets for the storing tensor, and the type= to pass. Values are
    rounded (or quantized) once, here: the tensor and the reference both come from
    these bits (quantizing dequantized values again is not idempotent for every type).
    Kept on the Arg (read-only): a sweep's case builds its tensors along several paths,
    and quantizing them again for each was a sixth of a quick sweep's time."""
    got = arg.__dict__.get("_raw_kept")
    if got is None:
        got = _raw_of(arg)
        got[0].flags.writeable = False
        object.__setattr__(arg, "_raw_kept", got)      # (a frozen dataclass: not a field)
    return got


def _raw_of(arg: Arg) -> tuple[np.ndarray, Type | None]:
    t = Type(arg.type)
    base = _base(arg)
    if t == Type.BF16:
        return _bf16(base), Type.BF16
    if t.is_quantized:
        # (a flat importance matrix for the types ggml quantizes only with one)
        im = np.ones(base.shape[-1], np.float32) if t.requires_imatrix else None
        return pyggml.quantize(t, base.astype(np.float32), imatrix=im), t
    return base.astype(t.numpy_dtype), None


def stored(arg: Arg) -> np.ndarray:
    """The values an Arg has once stored in its ggml type (what the reference sees)."""
    raw, t = _raw(arg)
    v = np.asarray(arg.value)
    base_shape = _base(arg).shape
    if t is not None:       # BF16 or quantized: decode the very bits the tensor gets
        base = pyggml.dequantize(t, raw, base_shape).astype(np.float64)
    elif np.issubdtype(raw.dtype, np.floating):
        base = raw.astype(np.float64)
    else:
        base = raw
    if arg.layout == "transposed":
        return np.swapaxes(base, -1, -2)
    if arg.layout == "permuted":
        lg = base.transpose(3, 2, 1, 0).transpose(np.argsort(arg.perm))
        return lg.transpose(3, 2, 1, 0).reshape(v.shape)
    if arg.layout == "strided":
        return base[..., :v.shape[-1]]
    return base


def _tensor(ctx: pyggml.Context, arg: Arg) -> pyggml.Tensor:
    raw, t = _raw(arg)
    return _layout(ctx, ctx.from_numpy(raw, type=t), arg)


def _layout(ctx: pyggml.Context, whole: pyggml.Tensor, arg: Arg) -> pyggml.Tensor:
    """The Arg's layout (a view, or ``whole`` itself) of its storing tensor."""
    if arg.layout == "contiguous":
        return whole
    if arg.layout == "transposed":
        return pyggml.transpose(ctx, whole)
    if arg.layout == "permuted":
        return pyggml.permute(ctx, whole, *arg.perm)
    v = np.asarray(arg.value)       # strided: a view of the first half of each row
    ne = tuple(reversed(v.shape)) + (1,) * (4 - v.ndim)
    return pyggml.view_4d(ctx, whole, ne[0], ne[1], ne[2], ne[3], whole.nb[1], whole.nb[2], whole.nb[3], 0)


def _nbytes_hint(sample: Sample) -> int:
    n = 0
    for a in sample.args:
        if isinstance(a, Arg):
            n += 16 * np.asarray(a.value).size + 4096
    return n


def read(t: pyggml.Tensor) -> np.ndarray:
    """A result tensor's values as float64 (or int) in numpy order (host memory: a view's
    strides as they are)."""
    typ = t.type
    return _values(typ, t.blocks() if typ.is_quantized else t.numpy(), t.shape)


def _values(typ: Type, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """float64 (or int) values of a tensor's data as numpy() / blocks() / get() show it."""
    if typ == Type.BF16 or typ.is_quantized:
        return pyggml.dequantize(typ, np.ascontiguousarray(raw), shape).astype(np.float64)
    a = np.array(raw)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def _packed(t: pyggml.Tensor) -> bool:
    """Whether a tensor's bytes are packed in ggml's order (ggml_is_contiguous)."""
    want = t.type.type_size
    if t.nb[0] != want:
        return False
    want = want * t.ne[0] // t.type.blck_size
    for i in range(1, 4):
        if t.ne[i] > 1 and t.nb[i] != want:
            return False
        want *= t.ne[i]
    return True


def _made(t: pyggml.Tensor) -> str:
    sub = t.sub_op
    return f"{t.op}:{sub}" if sub else t.op


def _shape4(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def _ref_args(sample: Sample) -> list[Any]:
    return [stored(a) if isinstance(a, Arg) else a for a in sample.args]


def _compare(info: OpInfo, out: np.ndarray, ref: Any) -> tuple[np.ndarray, float, float]:
    ref = np.asarray(ref)
    if _shape4(ref.shape) != _shape4(out.shape):
        raise AssertionError(f"{info.op}: ggml's result has shape {out.shape}, the reference {ref.shape}")
    ref = ref.reshape(out.shape)
    if info.exact or out.dtype.kind in "iu":
        err = 0.0 if np.array_equal(out, ref) else math.inf
        return ref, err, float(np.max(np.abs(out.astype(np.float64) - ref))) if out.size else 0.0
    err = nmse(out, ref)
    fin = np.isfinite(ref) & np.isfinite(out)
    max_abs = float(np.max(np.abs(out[fin] - ref[fin]))) if fin.any() else 0.0
    return ref, err, max_abs


def compute(info: OpInfo, sample: Sample, n_threads: int = 1, use_ref: bool = False,
            prove: bool = False) -> tuple[np.ndarray, str]:
    """ggml's result for one sample (float64, or int), and the op it made. ``use_ref``:
    the CPU backend's reference implementations (``ggml_cplan.use_ref``); ``prove``:
    first compute it once in a forked child with every tensor between guard pages (a
    read or write past a tensor raises UpstreamDefect "kernel-out-of-bounds")."""
    from pyggml.opinfo import train
    train.reset(sample)
    with pyggml.Context(_nbytes_hint(sample) + (16 << 20)) as ctx:
        args = [_tensor(ctx, a) if isinstance(a, Arg) else a for a in sample.args]
        t = getattr(pyggml, info.op)(ctx, *args)
        g = pyggml.Graph(ctx, 256)
        g.build_forward_expand(t)
        if prove:
            pyggml._cpu.prove(g, kept=True)
        g.compute(n_threads, use_ref=use_ref)
        return read(t), _made(t)


def compute_on_backend(info: OpInfo, sample: Sample, backend: pyggml.Backend) -> np.ndarray:
    """ggml's result for one sample computed by a backend: the inputs in a context's
    pool, the op (and whatever it builds) in a ``no_alloc`` context allocated in one of
    the backend's buffers, the graph computed with ``ggml_backend_graph_compute``."""
    if any(isinstance(a, pyggml.Tensor) for a in sample.args):
        raise ValueError("compute_on_backend: the sample passes ready tensors (a context pool's), not Args")
    with pyggml.Context(_nbytes_hint(sample) + (16 << 20)) as ctx, pyggml.Context(16 << 20, no_alloc=True) as out:
        # every tensor in the no_alloc context: the inputs' storing tensors (their bytes
        # set once the buffer exists), their layout views, the op and what it builds
        stored = []
        args = []
        for a in sample.args:
            if not isinstance(a, Arg):
                args.append(a)
                continue
            raw, typ = _raw(a)
            pooled = ctx.from_numpy(raw, type=typ)      # the same bits the ggml path gets
            whole = out.new_tensor(pooled.type, pooled.ne[:len(pooled.shape) or 1])   # its rank too
            stored.append((whole, pooled))
            args.append(_layout(out, whole, a))
        t = getattr(pyggml, info.op)(out, *args)
        if not backend.host and not _packed(t):
            t = pyggml.cont(out, t)         # get() copies whole tensors out of device memory
        backend.alloc_ctx_tensors(out)
        for whole, pooled in stored:
            whole.set(pooled.get())
        g = pyggml.Graph(out, 256)
        g.build_forward_expand(t)
        backend.graph_compute(g)
        return read(t) if backend.host else _values(t.type, t.get(), t.shape)


def _call_ref(info: OpInfo, sample: Sample, args: list[Any]) -> Any:
    if info.typed_ref:          # the reference needs the ggml types of the tensor args
        return info.ref(*args, types=tuple(Type(a.type) for a in sample.args if isinstance(a, Arg)))
    return info.ref(*args)


def reference(info: OpInfo, sample: Sample) -> np.ndarray:
    """The reference's result for one sample, on the values the Args have once stored."""
    return np.asarray(_call_ref(info, sample, _ref_args(sample)))


def run(info: OpInfo, sample: Sample, n_threads: int = 1, use_ref: bool = False) -> Result:
    """Compute one sample with ggml and with the reference."""
    out, made = compute(info, sample, n_threads, use_ref)
    ref = reference(info, sample)
    if info.canon is not None:
        out, ref = info.canon(out), info.canon(np.asarray(ref).reshape(out.shape))
    ref, err, max_abs = _compare(info, out, ref)
    return Result(out, ref, err, max_abs, made)


def gradients(info: OpInfo, sample: Sample, seed: int = 0,
              n_threads: int = 1) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """ggml's gradient of sum(result * c) (c random, from ``seed``), and central
    differences of the reference, for each F32 contiguous Arg marked ``param``:
    ({arg index: ggml's}, {arg index: numerical}), each in the Arg's shape."""
    rng = np.random.default_rng(seed)
    idx = [i for i, a in enumerate(sample.args)
           if isinstance(a, Arg) and a.param and Type(a.type) == Type.F32 and a.layout == "contiguous"]
    if not idx:
        raise ValueError(f"{info.op}: the sample has no F32 contiguous param Arg")
    base = _ref_args(sample)
    ref0 = np.asarray(_call_ref(info, sample, base), np.float64)
    c = rng.standard_normal(ref0.shape)
    with pyggml.Context(_nbytes_hint(sample) * 8 + (64 << 20)) as ctx:
        tensors = {}
        args = []
        for i, a in enumerate(sample.args):
            if isinstance(a, Arg):
                t = _tensor(ctx, a)
                if i in idx:
                    pyggml.set_param(t)
                    tensors[i] = t
                args.append(t)
            else:
                args.append(a)
        out = getattr(pyggml, info.op)(ctx, *args)
        ct = ctx.from_numpy(c.astype(np.float32).reshape(out.shape))
        loss = pyggml.sum(ctx, pyggml.mul(ctx, out, ct))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 2048, grads=True)
        g.build_forward_expand(loss)
        g.build_backward_expand()
        g.compute(n_threads)
        got = {}
        for i, t in tensors.items():
            gt = g.grad(t)
            got[i] = np.zeros(t.shape) if gt is None else read(gt)

    def loss_at(i: int, x: np.ndarray) -> float:
        args = list(base)
        args[i] = x
        return float(np.sum(np.asarray(_call_ref(info, sample, args), np.float64).reshape(ref0.shape) * c))

    numeric = {}
    for i in idx:
        x = np.asarray(base[i], np.float64)
        num = np.zeros_like(x)
        for k in np.ndindex(x.shape):
            h = 1e-6 * max(1.0, float(abs(x[k])))
            xp, xm = x.copy(), x.copy()
            xp[k] += h
            xm[k] -= h
            num[k] = (loss_at(i, xp) - loss_at(i, xm)) / (2 * h)
        numeric[i] = num
    return {i: np.asarray(got[i]).reshape(numeric[i].shape) for i in idx}, numeric


def grad_check(info: OpInfo, sample: Sample, seed: int = 0) -> dict[int, float]:
    """NMSE of ggml's gradient of sum(result * c) against central differences of the
    reference, for each F32 contiguous Arg marked ``param``: {arg index: NMSE}."""
    ggml_grads, numeric = gradients(info, sample, seed)
    return {i: nmse(ggml_grads[i], numeric[i]) for i in numeric}
