"""The subjects a sweep can check: every op of the registry (``op:NAME``), the
gradients of every op ggml can differentiate (``grad:NAME``), the attention gradients
(``attention``), and what users register (:func:`register_subject`)."""

from __future__ import annotations

import fnmatch
import functools
import math
import os
import zlib
from typing import Any, Callable, Iterable

import numpy as np

import pyggml
from pyggml import Type
from pyggml.errors import ArgumentError, GGMLError, GGMLVersionError, UnsupportedOpError, UpstreamDefect
from pyggml.opinfo import Arg, OpInfo, Sample, registry
from pyggml.opinfo import harness
from pyggml.parity import relations, torch_ops
from pyggml.parity.model import NOT_APPLICABLE, Case, Outcome, Subject

__all__ = ["AttentionSubject", "GradSubject", "OpSubject", "QuantSubject", "all_subjects", "path_names", "register_path",
           "register_subject", "subject"]

# the batch relation (pyggml.parity.relations): a batch in one graph, and its items one by one
RELATION_PATHS = ("batched", "per-item")
# relations of a path with ggml's own result: on 3 threads, in place, every argument contiguous
SELF_RELATIONS = ("threads", "inplace", "contiguous", "repeated")
GRAD_SAMPLES = 3          # gradient checks per op: the first few F32 contiguous samples, as the tests


def sample_seed(op: str, key: str, seed: int) -> int:
    """The generator seed of an op's samples of one type (or "grad"): the tests' own,
    shifted by ``seed`` (``PYGGML_SEED`` / ``pyggml parity --seed``)."""
    return zlib.crc32(repr((op, key)).encode()) ^ seed


def _outcome_of(e: GGMLError) -> Outcome:
    if isinstance(e, UpstreamDefect):
        if e.defect == "kernel-out-of-bounds":
            return Outcome(verdict="oob", detail=str(e), defect=e.defect)
        return Outcome(verdict="refused", detail=str(e), defect=e.defect)
    # what this ggml lacks, or an abort caught on a ggml pyggml's rules do not cover
    why = harness.release_abort(e)
    if why is not None:
        return Outcome(verdict="skipped", detail=why)
    return Outcome(verdict="error", detail=f"{type(e).__name__}: {e}")


class OpSubject(Subject):
    """One registry op: paths ``ggml`` (its CPU kernel; with ``probe`` first once in
    a forked child with every tensor between guard pages), ``ggml-ref`` (the CPU
    backend's reference implementations), ``reference`` (float64), ``torch``."""

    def __init__(self, info: OpInfo, probe: bool = True):
        self.info = info
        self.name = f"op:{info.op}"
        self.op = info.op
        self.probe = probe
        self._builtin_paths = (("ggml", "ggml-ref", "cpu-backend", "reference") + device_paths() +
                               (("torch",) if torch_ops.has(info.op) else ()) +
                               (RELATION_PATHS if info.op in relations.BATCH else ()) + ("threads",) +
                               (("inplace",) if relations.inplace_twin(info.op) else ()) + ("contiguous",) +
                               (("repeated",) if info.op in relations.BROADCAST else ()))

    @property
    def paths(self) -> tuple[str, ...]:  # type: ignore[override]
        # the registered op paths count from the moment they are registered
        return self._builtin_paths + tuple(n for n, (_, ops) in _USER_PATHS.items()
                                           if ops is None or any(fnmatch.fnmatchcase(self.op, p) for p in ops))

    @functools.lru_cache(maxsize=8)
    def _samples(self, type_name: str, seed: int) -> list[Sample]:
        rng = np.random.default_rng(sample_seed(self.op, type_name, seed))
        return list(self.info.samples(rng, Type[type_name]))

    def cases(self, seed: int, quick: bool) -> list[Case]:
        out = []
        for t in self.info.types:
            samples = self._samples(t.name, seed)
            for i, s in enumerate(samples[:2] if quick else samples):
                out.append(Case(self.name, t.name, i, seed, f"{t.name} {s.name}"))
        return out

    def sample(self, case: Case) -> Sample:
        return self._samples(case.type, case.seed)[case.index]

    def compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        got = self._compute(case, path, n_threads)
        if self.info.canon is not None and got.arrays:      # what ggml promises of the result
            got.arrays = [self.info.canon(np.asarray(a)) for a in got.arrays]
        return got

    def compares(self, a: str, b: str) -> bool:
        # a relation's two paths compute another input (a batch): compared with each other only;
        # the threads path, with ggml's own
        for rel in SELF_RELATIONS:
            if rel in (a, b):
                return {a, b} == {"ggml", rel}
        return (a in RELATION_PATHS) == (b in RELATION_PATHS)

    def _relation(self, case: Case, path: str, n_threads: int) -> Outcome:
        pair = relations.batch_pair(self.info, self.sample(case), case.seed)
        if isinstance(pair, str):
            return Outcome(verdict="skipped", detail=f"{path}: {pair}")
        whole, items = pair
        try:
            if path == "batched":
                out, _ = harness.compute(self.info, whole, n_threads)
                return Outcome([relations.as_four(out)])
            outs = [harness.compute(self.info, one, n_threads)[0] for one in items]
        except GGMLError as e:
            return _outcome_of(e)
        return Outcome([relations.stack_results(self.op, outs, items)])

    def _compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        if path in RELATION_PATHS:
            return self._relation(case, path, n_threads)
        s = self.sample(case)
        if path == "threads":
            n_threads = relations.other_threads(n_threads)
        elif path in ("contiguous", "repeated"):
            other = relations.contiguous(s) if path == "contiguous" else relations.repeated(self.op, s)
            if other is None:
                return Outcome(verdict=NOT_APPLICABLE)
            s = other
        info = self.info
        if path == "inplace":
            info = registry()[relations.inplace_twin(self.op)]
        try:
            if path in _USER_PATHS:
                from pyggml.opinfo.train import reset
                reset(s)
                return Outcome([np.asarray(_USER_PATHS[path][0](self.info, s, n_threads))])
            if path == "reference":
                try:
                    return Outcome([np.asarray(harness.reference(self.info, s), np.float64)])
                except Exception as e:
                    if not s.defect:
                        raise
                    # a defect's sample may lie outside what the reference models
                    return Outcome(verdict="refused", detail=f"the sample of the defect {s.defect}, which the "
                                   f"reference does not model ({type(e).__name__}: {e})", defect=s.defect)
            if path == "cpu-backend" or path.startswith("backend:"):
                if any(isinstance(a, pyggml.Tensor) for a in s.args):
                    return Outcome(verdict="skipped", detail=f"{path}: the sample passes a ready tensor of a "
                                                             "context pool, which no backend buffer holds")
                be = _backend(n_threads) if path == "cpu-backend" else _device(path.partition(":")[2])
                try:
                    return Outcome([harness.compute_on_backend(self.info, s, be)])
                except UnsupportedOpError as e:      # ggml_backend_supports_op: not this backend's op
                    return Outcome(verdict="skipped", detail=f"{path}: {e}")
                except ArgumentError as e:
                    # index ops (get_rows, ...): pyggml checks their positions in host memory only
                    if be.host or "reads positions from tensor values" not in str(e):
                        raise
                    return Outcome(verdict="skipped", detail=f"{path}: {e}")
            if path == "torch":
                if Type[case.type] != Type.F32:
                    return Outcome(verdict="skipped", detail="the torch path takes F32 samples")
                try:
                    return Outcome([torch_ops.run(self.op, harness._ref_args(s), n_threads)])
                except Exception as e:      # a sample our torch one-liner does not cover (torch's error)
                    return Outcome(verdict="skipped", detail=f"torch: {type(e).__name__}: {str(e)[:200]}")
            out, _ = harness.compute(info, s, n_threads, use_ref=(path == "ggml-ref"),
                                     prove=self.probe and path == "ggml")
        except GGMLError as e:
            got = _outcome_of(e)
            if got.verdict == "refused" and s.defect and got.defect != s.defect:
                got.verdict, got.detail = "fail", f"refused as {got.defect}, the sample expects {s.defect}: {e}"
            return got
        if s.defect:
            return Outcome(verdict="fail", detail=f"the sample expects the defect {s.defect}, but ggml computed it")
        return Outcome([out])

    def tolerance(self, case: Case, a: str, b: str, n_threads: int = 1) -> float:
        if {a, b} == {"ggml", "threads"}:
            return relations.threads_tolerance(self.op, case.type)
        if {a, b} == {"ggml", "contiguous"}:
            return relations.contiguous_tolerance(self.op)
        if {a, b} == {"ggml", "inplace"}:
            return relations.inplace_tolerance(self.op)     # the same kernel, in its input's memory
        if {a, b} == {"ggml", "repeated"}:
            return 0.0          # the same rows, repeated
        if {a, b} == set(RELATION_PATHS) and n_threads > 1:
            # on more than one thread the batch changes how ggml splits a node, as the count
            # does (flash_attn_ext's split-KV path: a batch of query rows takes the row split)
            return relations.threads_tolerance(self.op, case.type)
        if self.info.exact or {a, b} == {"ggml", "cpu-backend"} or {a, b} == set(RELATION_PATHS):
            return 0.0          # the same kernels on the same inputs (rows): the same bits
        tol = self.info.tolerance(Type[case.type])
        return tol if b == "reference" else (2 * math.sqrt(tol)) ** 2

    def repro(self, case: Case) -> str:
        return (f"import numpy as np, pyggml\n"
                f"from pyggml.opinfo import registry\n"
                f"from pyggml.opinfo.harness import run\n"
                f"info = registry()[{self.op!r}]\n"
                f"t = pyggml.Type.{case.type}\n"
                f"sample = list(info.samples(np.random.default_rng({sample_seed(self.op, case.type, case.seed)}), t))"
                f"[{case.index}]\n"
                f"res = run(info, sample)\n"
                f"print(sample.name, 'NMSE', res.nmse, 'tolerance', info.tolerance(t))\n")


class GradSubject(Subject):
    """ggml's autodiff of one op (``autodiff``) against central differences of its
    float64 reference (``reference``), for a random cotangent."""

    paths = ("autodiff", "reference")

    def __init__(self, info: OpInfo):
        self.info = info
        self.name = f"grad:{info.op}"
        self.op = info.op

    @functools.lru_cache(maxsize=4)
    def _samples(self, seed: int) -> list[tuple[int, Sample]]:
        rng = np.random.default_rng(sample_seed(self.op, "grad", seed))
        picked = [(i, s) for i, s in enumerate(self.info.samples(rng, Type.F32))
                  if all(a.layout == "contiguous" for a in s.args if isinstance(a, Arg)) and not s.defect]
        return picked[:GRAD_SAMPLES] + [p for p in picked[GRAD_SAMPLES:] if p[1].grad_defect]

    def cases(self, seed: int, quick: bool) -> list[Case]:
        picked = self._samples(seed)
        return [Case(self.name, "F32", i, seed, f"F32 {s.name}") for i, (_, s) in enumerate(picked[:1] if quick else picked)]

    @functools.lru_cache(maxsize=2)
    def _both(self, case: Case, n_threads: int) -> tuple[list[np.ndarray], list[np.ndarray]] | Outcome:
        _, s = self._samples(case.seed)[case.index]
        try:
            got, num = harness.gradients(self.info, s, n_threads=n_threads)
        except GGMLError as e:
            out = _outcome_of(e)
            if out.verdict == "refused" and s.grad_defect and out.defect != s.grad_defect:
                out.verdict = "fail"
            return out
        if s.grad_defect:
            return Outcome(verdict="fail", detail=f"the sample expects the defect {s.grad_defect} in the backward "
                                                  f"pass, but ggml computed it")
        keys = sorted(num)
        return [got[k] for k in keys], [num[k] for k in keys]

    def compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        both = self._both(case, n_threads)
        if isinstance(both, Outcome):
            return both
        return Outcome(both[0] if path == "autodiff" else both[1])

    def tolerance(self, case: Case, a: str, b: str, n_threads: int = 1) -> float:
        return self.info.grad_tol

    def repro(self, case: Case) -> str:
        i, _ = self._samples(case.seed)[case.index]
        return (f"import numpy as np, pyggml\n"
                f"from pyggml.opinfo import registry\n"
                f"from pyggml.opinfo.harness import grad_check\n"
                f"info = registry()[{self.op!r}]\n"
                f"sample = list(info.samples(np.random.default_rng({sample_seed(self.op, 'grad', case.seed)}), "
                f"pyggml.Type.F32))[{i}]\n"
                f"print(sample.name, 'gradient NMSE per argument', grad_check(info, sample))\n")


class AttentionSubject(Subject):
    """The attention gradients (dq, dk, dv) of FLASH_ATTN_BACK (``ggml``), of pyggml's
    blocked kernel (``blocked``), of ggml's
    autodiff of the forward built from ggml ops (``autodiff``), of the float64
    reference, and of torch (pyggml.parity.attention)."""

    name = "attention"
    op = "flash_attn_back"

    def __init__(self):
        from pyggml.parity import attention
        self._a = attention
        self.paths = ("ggml", "blocked", "autodiff", "reference") + (("torch",) if attention.torch_available() else ())

    @functools.lru_cache(maxsize=2)
    def _sweep(self, quick: bool) -> list[Any]:
        return self._a.sweep(quick)

    def cases(self, seed: int, quick: bool) -> list[Case]:
        full = self._sweep(False)
        chosen = self._sweep(quick)
        return [self.case(c, seed, full.index(c)) for c in chosen]

    def case(self, config: Any, seed: int = 0, index: int = 0) -> Case:
        """The case of any attention configuration (pyggml.parity.attention.Config): its
        label is the configuration's name, which compute reads back."""
        return Case(self.name, "F32", index, seed, config.name)

    def compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        c = self._a.Config.from_name(case.label)
        q, k, v, d = c.inputs(case.seed)
        try:
            if path in ("ggml", "blocked", "autodiff"):
                fn = {"ggml": self._a.path_kernel, "blocked": self._a.path_blocked,
                      "autodiff": self._a.path_autodiff}[path]
                grads = fn(q, k, v, d, c.masked, n_threads)
            else:
                grads = (self._a.path_reference if path == "reference" else self._a.path_torch)(q, k, v, d, c.masked)
            return Outcome([np.asarray(g) for g in grads])
        except self._a.Refused as e:
            return Outcome(verdict="refused", detail=str(e), defect=e.defect)
        except GGMLError as e:
            return _outcome_of(e)

    def tolerance(self, case: Case, a: str, b: str, n_threads: int = 1) -> float:
        return self._a.NMSE_REF if b == "reference" else self._a.NMSE_F32

    def repro(self, case: Case) -> str:
        return (f"from pyggml import parity\n"
                f"from pyggml.parity.report import format_rows\n"
                f"rows, _ = parity.check_case(parity.Case({case.subject!r}, {case.type!r}, {case.index}, "
                f"{case.seed}, {case.label!r}))\n"
                f"print(format_rows(rows))\n")


class QuantSubject(Subject):
    """One quantized type: seeded rows quantized by ggml_quantize_chunk (``quantize``), by a
    graph's F32 -> type copy (``cpy``) and again from their own dequantized values
    (``requantize``), compared by those values (pyggml.parity.relations.QUANT_DIFFERS)."""

    paths = ("quantize", "cpy", "requantize")
    SHAPES = ((8, 512), (3, 256), (16, 1024))

    def __init__(self, t: Type):
        self.type = t
        self.name = f"quant:{t.name}"
        self.op = "cpy"
        self.on_request = t.name in self.SLOW_INIT

    # types whose first quantization in a process builds search tables (0.8 to 5.5 s each on
    # a Zen 4 core, 10 s together, in every worker): checked when a selection names them
    SLOW_INIT = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S")

    def cases(self, seed: int, quick: bool) -> list[Case]:
        gens = ("normal", "uniform", "outliers")
        return [Case(self.name, self.type.name, i, seed, f"{gens[i]} {self.SHAPES[i]}") for i in range(1 if quick else 3)]

    def _rows(self, case: Case) -> np.ndarray:
        rng = np.random.default_rng(sample_seed(self.name, self.type.name, case.seed) + case.index)
        shape = self.SHAPES[case.index]
        if case.index == 0:
            return rng.standard_normal(shape).astype(np.float32)
        x = rng.uniform(-1.0, 1.0, shape)
        if case.index == 2:
            x[rng.random(shape) < 0.01] *= 40.0             # a few large values per block
        return x.astype(np.float32)

    def _quantize(self, x: np.ndarray) -> np.ndarray:
        im = np.ones(x.shape[-1], np.float32) if self.type.requires_imatrix else None
        return pyggml.quantize(self.type, x, imatrix=im)

    def compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        x = self._rows(case)
        try:
            if path == "cpy":
                with pyggml.Context(x.nbytes * 3 + (1 << 20)) as ctx:
                    c = pyggml.cpy(ctx, ctx.from_numpy(x), ctx.new_tensor(self.type, x.shape[::-1]))
                    g = pyggml.Graph(ctx)
                    g.build_forward_expand(c)
                    g.compute(n_threads)
                    raw = np.array(c.blocks())
            else:
                raw = self._quantize(x)
                if path == "requantize":
                    raw = self._quantize(pyggml.dequantize(self.type, raw, x.shape).astype(np.float32))
            return Outcome([pyggml.dequantize(self.type, raw, x.shape).astype(np.float64)])
        except UnsupportedOpError as e:
            return Outcome(verdict="skipped", detail=f"{path}: {e}")
        except GGMLError as e:
            if path == "cpy" and "cannot quantize" in str(e):
                return Outcome(verdict="skipped", detail=f"cpy: {e}")
            return _outcome_of(e)

    def compares(self, a: str, b: str) -> bool:
        return "quantize" in (a, b)

    def tolerance(self, case: Case, a: str, b: str, n_threads: int = 1) -> float:
        return relations.quant_tolerance(b if a == "quantize" else a, self.type.name)

    def repro(self, case: Case) -> str:
        return (f"from pyggml import parity\n"
                f"rows = parity.check_case(parity.Case({case.subject!r}, {case.type!r}, {case.index}, "
                f"{case.seed}, {case.label!r}))[0]\n"
                f"print(rows)\n")


def _quant_types() -> list[Type]:
    """The quantized types ggml reads back (a to_float: not Q8_1 and Q8_K, the dot products'
    own), found without quantizing (a grid type's first quantization builds its tables)."""
    out = []
    for t in Type:
        if not t.is_quantized:
            continue
        try:
            pyggml.dequantize(t, np.zeros(t.type_size, np.uint8), (t.blck_size,))
        except GGMLError:
            continue
        out.append(t)
    return out


_USER: dict[str, Subject] = {}
_USER_PATHS: dict[str, tuple[Callable[[OpInfo, Sample, int], Any], tuple[str, ...] | None]] = {}
BUILTIN_PATHS = ("ggml", "ggml-ref", "cpu-backend", "blocked", "reference", "autodiff", "torch") + SELF_RELATIONS + \
    RELATION_PATHS


@functools.lru_cache(maxsize=4)
def _backend(n_threads: int) -> pyggml.Backend:
    """The CPU backend the ``cpu-backend`` path computes on (one per thread count)."""
    return pyggml.Backend("CPU", n_threads=n_threads)


# the RPC server of the ``backend:RPC`` path ("host:port"): set per worker by the runner
# (pyggml parity --rpc), since a server serves one client at a time
RPC_ENV = "PYGGML_RPC_ENDPOINT"


def device_paths() -> tuple[str, ...]:
    """``backend:NAME`` for each device of the linked ggml other than the CPU (the BLAS
    backend of a PYGGML_BLAS build, a GPU), and ``backend:RPC`` where PYGGML_RPC_ENDPOINT
    names an RPC server: every registry op runs on it where its ``supports_op`` says it
    can (``skipped`` elsewhere), judged by the reference."""
    rpc = ("backend:RPC",) if os.environ.get(RPC_ENV) else ()
    return tuple(f"backend:{d['name']}" for d in pyggml.backends() if d["type"] != "cpu") + rpc


@functools.lru_cache(maxsize=8)
def _device(name: str) -> pyggml.Backend:
    if name == "RPC":
        return pyggml.Backend("RPC", endpoint=os.environ[RPC_ENV])
    return pyggml.Backend(name)


def register_path(name: str, compute: Callable[[OpInfo, Sample, int], Any], ops: Iterable[str] | None = None) -> None:
    """Add a path of your own to the registry ops (those matching the globs ``ops``; all
    if None): ``compute(info, sample, n_threads)`` returns the op's result for the
    sample, as the reference's array (a GGMLError it raises becomes that row's verdict).
    For example another build of ggml, a backend, or a kernel of your own. Register it
    at import time of a module, as with :func:`register_subject`."""
    if not name or name in BUILTIN_PATHS or name.startswith("backend:"):
        raise ArgumentError(f"a path needs a name of its own, not one of {', '.join(BUILTIN_PATHS)}")
    _USER_PATHS[name] = (compute, tuple(ops) if ops is not None else None)


def path_names() -> tuple[str, ...]:
    """Every path a subject may have: the built-in ones and the registered ones."""
    return BUILTIN_PATHS + device_paths() + tuple(_USER_PATHS)


def register_subject(s: Subject) -> Subject:
    """Add a subject of your own to every sweep of this process (and of its workers: do
    it at import time of a module, as multiprocessing's spawn start method re-imports
    the main module). Returns it."""
    if not s.name or not s.paths:
        raise ArgumentError("a subject needs a name and at least one path")
    _USER[s.name] = s
    return s


@functools.lru_cache(maxsize=2)
def _builtin(probe: bool) -> dict[str, Subject]:
    out: dict[str, Subject] = {}
    for name, info in sorted(registry().items()):
        if not _callable(name):
            continue
        out[f"op:{name}"] = OpSubject(info, probe)
        if info.grad:
            out[f"grad:{name}"] = GradSubject(info)
    if pyggml.build_info()["features"]["flash_attn_back"]:
        out["attention"] = AttentionSubject()
    for t in _quant_types():
        out[f"quant:{t.name}"] = QuantSubject(t)
    return out


def _callable(name: str) -> bool:
    from pyggml import _optable
    row = next((r for r in _optable.OPS if r["name"] == name), None)
    return row is not None and (row["available"] or ("impl=pyggml" in row["flags"] and hasattr(pyggml, name)))


def all_subjects(probe: bool = True) -> dict[str, Subject]:
    """Every subject: the built-in ones, then the registered ones."""
    d = dict(_builtin(probe))
    d.update(_USER)
    return d


def subject(name: str, probe: bool = True) -> Subject:
    return all_subjects(probe)[name]

