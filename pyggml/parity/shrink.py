"""Shrink a failing case of an op to the smallest one that still fails the same way, and
write it as a standalone reproducer: in Python (pyggml's public API) and in C (ggml's API
only, ready to attach to an upstream issue).

A case *fails* when ggml's result is beyond the op's tolerance from the float64 reference
(the ``ggml~reference`` row's verdict ``fail``). Shrinking is greedy, as hypothesis'
shrinker and C-Reduce are: it tries smaller sizes for each dimension (every tensor whose
size there is the same shrinks together, so their shapes stay consistent), then simpler
values (integers, then zeros, halves of the elements at a time), and keeps a candidate
only where the failure remains; a candidate that raises (a shape the builder refuses) is
not kept. The reproducers embed the shrunk inputs and the reference's values, compute the
op, print the NMSE beside the tolerance and exit 1 where it is beyond, as the case did.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

import pyggml
from pyggml import Type
from pyggml.errors import ArgumentError, GGMLError
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo import harness

__all__ = ["Shrunk", "c_source", "fails", "python_source", "shrink", "shrink_case", "write"]


@dataclasses.dataclass
class Shrunk:
    info: OpInfo
    type: Type
    sample: Sample                      # the smallest failing sample found
    nmse: float                         # its ggml~reference NMSE
    tol: float
    tries: int                          # candidates computed
    kept: int                           # candidates that still failed (steps taken)
    elements_before: int
    elements_after: int


def _elements(s: Sample) -> int:
    return sum(np.asarray(a.value).size for a in s.args if isinstance(a, Arg))


def fails(info: OpInfo, s: Sample, t: Type) -> float | None:
    """The sample's NMSE where ggml's result is beyond the tolerance from the reference;
    None where it is within (or where the sample cannot be computed: not the same failure)."""
    try:
        res = harness.run(info, s)
    except (GGMLError, ValueError, AssertionError, IndexError):
        return None
    if info.exact:
        return math.inf if res.nmse > 0 else None
    return res.nmse if not res.nmse <= info.tolerance(t) else None


def _axis(v: np.ndarray, d: int) -> int | None:
    return v.ndim - 1 - d if d < v.ndim else None


def _with_dim(s: Sample, d: int, n: int, keep: np.ndarray) -> Sample:
    """Every tensor argument whose ggml dimension d has size n, cut to the indices ``keep``."""
    args = []
    for a in s.args:
        if isinstance(a, Arg):
            v = np.asarray(a.value)
            ax = _axis(v, d)
            if ax is not None and v.shape[ax] == n:
                a = dataclasses.replace(a, value=np.take(v, keep, axis=ax))
        args.append(a)
    return Sample(tuple(args), s.name)


def _with_value(s: Sample, i: int, v: np.ndarray) -> Sample:
    args = list(s.args)
    args[i] = dataclasses.replace(args[i], value=v)
    return Sample(tuple(args), s.name)


def _candidates_dims(s: Sample):
    sizes: dict[int, set[int]] = {}
    for a in s.args:
        if isinstance(a, Arg):
            v = np.asarray(a.value)
            for d in range(v.ndim):
                n = v.shape[v.ndim - 1 - d]
                if n > 1:
                    sizes.setdefault(d, set()).add(n)
    for d in sorted(sizes, reverse=True):           # the outer dimensions first
        for n in sorted(sizes[d], reverse=True):
            # one index (each of the first 16), a half, all but the last or the first
            keeps = [np.array([k]) for k in range(min(n, 16))]
            keeps += [np.arange(n // 2), np.arange(n // 2, n), np.arange(n - 1), np.arange(1, n)]
            for keep in keeps:
                if 1 <= keep.size < n:
                    yield _with_dim(s, d, n, keep)


def _candidates_values(s: Sample):
    for i, a in enumerate(s.args):
        if not isinstance(a, Arg) or np.asarray(a.value).dtype.kind not in "f":
            continue
        v = np.asarray(a.value, np.float64)
        for simpler in (np.round(v), np.round(v * 2) / 2, np.sign(v)):
            if not np.array_equal(simpler, v):
                yield _with_value(s, i, simpler)
        flat = v.reshape(-1)
        k = flat.size
        while k >= 1:                               # zero blocks of k elements: all, halves, ...
            for start in range(0, flat.size, k):
                z = flat.copy()
                z[start:start + k] = 0.0
                if not np.array_equal(z, flat):
                    yield _with_value(s, i, z.reshape(v.shape))
            k //= 2


def shrink(info: OpInfo, s: Sample, t: Type, budget: int = 600,
           still: Callable[[OpInfo, Sample, Type], float | None] = fails) -> Shrunk:
    """The smallest sample found (within ``budget`` candidates) that still fails."""
    first = still(info, s, t)
    if first is None:
        raise ArgumentError(f"shrink: {info.op} [{s.name}] does not fail (ggml is within {info.tolerance(t):.1e} "
                            f"of the reference): nothing to shrink")
    best, err, tries, kept = s, first, 0, 0
    progress = True
    while progress and tries < budget:
        progress = False
        for gen in (_candidates_dims, _candidates_values):
            for cand in gen(best):
                if tries >= budget:
                    break
                tries += 1
                e = still(info, cand, t)
                if e is not None:
                    best, err, kept, progress = cand, e, kept + 1, True
                    break                           # start again from the smaller case
            if progress:
                break
    return Shrunk(info, t, best, err, info.tolerance(t), tries, kept, _elements(s), _elements(best))


# --- reproducers ------------------------------------------------------------------------------

def _literal(v: np.ndarray) -> str:
    return "[" + ", ".join(repr(float(x)) if np.asarray(v).dtype.kind == "f" else str(int(x))
                           for x in np.asarray(v).reshape(-1)) + "]"


def _stored(a: Arg) -> np.ndarray:
    """The values the tensor holds (rounded to its type), in the Arg's numpy order."""
    return harness.stored(a)


def python_source(sh: Shrunk) -> str:
    """A standalone Python reproducer (numpy and pyggml's public API)."""
    s, op = sh.sample, sh.info.op
    ref = np.asarray(harness.reference(sh.info, s), np.float64)
    lines = ["import numpy as np", "import pyggml", "",
             f"# {op} [{s.name}], shrunk from {sh.elements_before} to {sh.elements_after} input elements",
             "with pyggml.Context(16 << 20) as ctx:"]
    call = []
    for i, a in enumerate(s.args):
        if not isinstance(a, Arg):
            call.append(repr(a) if not isinstance(a, np.ndarray) else f"np.array({a.tolist()!r})")
            continue
        t = Type(a.type)
        name = f"x{i}"
        base = harness._base(a)
        if t in (Type.F32, Type.F16, Type.I32):
            dt = {Type.F32: "np.float32", Type.F16: "np.float16", Type.I32: "np.int32"}[t]
            lines.append(f"    {name} = ctx.from_numpy(np.array({_literal(base.astype(t.numpy_dtype))}, {dt})"
                         f".reshape({base.shape}))")
        else:
            lines.append(f"    {name} = ctx.from_numpy(pyggml.quantize(pyggml.Type.{t.name}, "
                         f"np.array({_literal(base)}, np.float32).reshape({base.shape})), type=pyggml.Type.{t.name})")
        lines += _python_layout(name, a)
        call.append(name)
    lines += [f"    out = pyggml.{op}(ctx, {', '.join(call)})",
              "    g = pyggml.Graph(ctx)", "    g.build_forward_expand(out)", "    g.compute(1)",
              "    got = np.array(out.numpy(), np.float64).reshape(-1)",
              f"expected = np.array({_literal(ref)})   # float64 reference (pyggml.opinfo)",
              "nmse = float(np.sum((got - expected) ** 2) / max(np.sum(expected ** 2), 1e-300))",
              f"print('{op}: ggml', got, 'expected', expected, 'NMSE', nmse, 'tolerance {sh.tol:g}')",
              f"raise SystemExit(1 if not nmse <= {sh.tol!r} else 0)", ""]
    return "\n".join(lines)


def _python_layout(name: str, a: Arg) -> list[str]:
    if a.layout == "contiguous":
        return []
    if a.layout == "transposed":
        return [f"    {name} = pyggml.transpose(ctx, {name})"]
    if a.layout == "permuted":
        return [f"    {name} = pyggml.permute(ctx, {name}, {', '.join(map(str, a.perm))})"]
    v = np.asarray(a.value)
    ne = tuple(reversed(v.shape)) + (1,) * (4 - v.ndim)
    return [f"    {name} = pyggml.view_4d(ctx, {name}, {ne[0]}, {ne[1]}, {ne[2]}, {ne[3]}, {name}.nb[1], "
            f"{name}.nb[2], {name}.nb[3], 0)"]


_C_TYPES = {Type.F32: "GGML_TYPE_F32", Type.F16: "GGML_TYPE_F16", Type.I32: "GGML_TYPE_I32"}


def c_source(sh: Shrunk) -> str | None:
    """A standalone C reproducer against ggml's API only, or None where the case has what
    it cannot say in a few lines (a type other than F32, F16 and I32; a builder of
    pyggml's own)."""
    from pyggml import _optable
    row = next((r for r in _optable.OPS if r["name"] == sh.info.op), None)
    if row is None or "impl=pyggml" in row["flags"]:
        return None
    s = sh.sample
    params = row["params"]
    if len(params) != len(s.args):
        return None
    ref = np.asarray(harness.reference(sh.info, s), np.float64).reshape(-1)
    body, call = [], []
    for i, ((pname, ctype, kind), a) in enumerate(zip(params, s.args)):
        if isinstance(a, Arg):
            t = Type(a.type)
            if t not in _C_TYPES:
                return None
            base = harness._base(a)
            ne = tuple(reversed(base.shape)) + (1,) * (4 - base.ndim)
            name = f"t{i}"
            vals = base.astype(np.float64).reshape(-1)
            if t == Type.I32:
                body.append(f"    static const int32_t {name}_v[] = {{{', '.join(str(int(x)) for x in vals)}}};")
            else:
                body.append(f"    static const float {name}_v[] = {{{', '.join(_cfloat(x) for x in vals)}}};")
            body.append(f"    struct ggml_tensor * {name} = ggml_new_tensor_4d(ctx, {_C_TYPES[t]}, "
                        f"{ne[0]}, {ne[1]}, {ne[2]}, {ne[3]});")
            if t == Type.F16:
                body.append(f"    ggml_fp32_to_fp16_row({name}_v, (ggml_fp16_t *) {name}->data, {vals.size});")
            else:
                body.append(f"    memcpy({name}->data, {name}_v, sizeof {name}_v);")
            body += _c_layout(name, a)
            call.append(name)
        elif a is None:
            call.append("NULL")
        elif kind == "tensor" or isinstance(a, (np.ndarray, list, tuple, pyggml.Tensor)):
            return None
        elif isinstance(a, bool):
            call.append("true" if a else "false")
        elif isinstance(a, float) or "float" in ctype:
            call.append(_cfloat(float(a)))
        else:
            call.append(f"({ctype}) {int(a)}")
    n = ref.size
    return "\n".join([
        f"// {sh.info.op} [{s.name}]: shrunk by pyggml parity shrink from {sh.elements_before} to "
        f"{sh.elements_after} input elements; ggml's result is beyond NMSE {sh.tol:g} from float64",
        "#include <math.h>", "#include <stdbool.h>", "#include <stdint.h>", "#include <stdio.h>", "#include <string.h>",
        '#include "ggml.h"', '#include "ggml-cpu.h"', "", "int main(void) {",
        "    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };",
        "    struct ggml_context * ctx = ggml_init(ip);", *body,
        f"    struct ggml_tensor * out = ggml_{sh.info.op}(ctx, {', '.join(call)});",
        "    struct ggml_cgraph * gf = ggml_new_graph(ctx);", "    ggml_build_forward_expand(gf, out);",
        "    ggml_graph_compute_with_ctx(ctx, gf, 1);",
        f"    static const double expected[] = {{{', '.join(repr(float(x)) for x in ref)}}};   // float64 reference",
        "    double d = 0, e = 0;",
        f"    for (int i = 0; i < {n}; i++) {{",
        "        double x = ggml_get_f32_1d(out, i);",
        '        printf("%d: ggml %.9g expected %.9g\\n", i, x, expected[i]);',
        "        d += (x - expected[i]) * (x - expected[i]); e += expected[i] * expected[i];",
        "    }",
        "    double nmse = d / (e > 0 ? e : 1e-300);",
        f'    printf("NMSE %g, tolerance %g\\n", nmse, {sh.tol!r});',
        "    ggml_free(ctx);",
        f"    return !(nmse <= {sh.tol!r});",
        "}", ""])


def _cfloat(x: float) -> str:
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    v = np.float32(x)
    if v == 0 or 1e-4 <= abs(v) < 1e7:
        text = np.format_float_positional(v, unique=True, trim="0")
    else:
        text = np.format_float_scientific(v, unique=True, trim="0")
    return text + "f"


def _c_layout(name: str, a: Arg) -> list[str]:
    if a.layout == "contiguous":
        return []
    if a.layout == "transposed":
        return [f"    {name} = ggml_transpose(ctx, {name});"]
    if a.layout == "permuted":
        return [f"    {name} = ggml_permute(ctx, {name}, {', '.join(map(str, a.perm))});"]
    v = np.asarray(a.value)
    ne = tuple(reversed(v.shape)) + (1,) * (4 - v.ndim)
    return [f"    {name} = ggml_view_4d(ctx, {name}, {ne[0]}, {ne[1]}, {ne[2]}, {ne[3]}, {name}->nb[1], "
            f"{name}->nb[2], {name}->nb[3], 0);"]


def shrink_case(key: str, seed: int = 0, budget: int = 600) -> Shrunk:
    """Shrink the case ``key`` ("op:NAME|TYPE|INDEX", a row's subject, type and index, as
    ``pyggml parity --json`` reports them) drawn with ``seed``."""
    from pyggml.opinfo import registry
    from pyggml.parity.subjects import sample_seed
    subject, _, rest = key.partition("|")
    type_name, _, index = rest.partition("|")
    if not subject.startswith("op:") or not index.isdigit():
        raise ArgumentError(f"shrink: a case is op:NAME|TYPE|INDEX (an op subject's row), not {key!r}")
    op = subject[3:]
    info = registry().get(op)
    if info is None:
        raise ArgumentError(f"shrink: no op {op!r} in the registry")
    try:
        t = Type[type_name]
    except KeyError:
        raise ArgumentError(f"shrink: no ggml type {type_name!r}") from None
    if t not in info.types:
        raise ArgumentError(f"shrink: {op} has no samples of {type_name}")
    samples = list(info.samples(np.random.default_rng(sample_seed(op, type_name, seed)), t))
    if int(index) >= len(samples):
        raise ArgumentError(f"shrink: {op} has {len(samples)} samples of {type_name}, not {int(index) + 1}")
    return shrink(info, samples[int(index)], t, budget)


def write(sh: Shrunk, folder: str, stem: str) -> list[str]:
    """The reproducers written into ``folder``: stem.py, and stem.c where C can say it."""
    import os
    os.makedirs(folder, exist_ok=True)
    out = []
    for ext, text in (("py", python_source(sh)), ("c", c_source(sh))):
        if text is None:
            continue
        path = os.path.join(folder, f"{stem}.{ext}")
        with open(path, "w") as f:
            f.write(text)
        out.append(path)
    return out
