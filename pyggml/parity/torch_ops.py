"""The ``torch`` path of op subjects: the same op computed by torch on the CPU, in
float32, for the ops whose meaning torch has one function (or a line) for. Only where
torch is importable; never required."""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

__all__ = ["OPS", "available", "has", "run"]


# the ops of _table(), known without importing torch (1.3-1.6 s of CPU per process: a
# sweep's worker imports it at its first torch case, never when no torch path is asked);
# tests/test_parity_sweep.py checks that the two agree
OPS = frozenset({
    "sqr", "sqrt", "log", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "silu", "neg", "abs", "elu",
    "gelu_erf", "hardswish", "hardsigmoid", "floor", "ceil", "trunc", "expm1", "softplus", "sgn", "soft_max",
    "norm", "rms_norm", "sum_rows", "cumsum", "mul_mat"})


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether torch is installed (found, not imported)."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def _table() -> dict[str, Callable[..., Any]]:
    import torch  # type: ignore[import-not-found]
    F = torch.nn.functional

    def rms_norm(a, eps):
        return a / torch.sqrt((a * a).mean(-1, keepdim=True) + eps)

    return {
        "sqr": lambda a: a * a, "sqrt": torch.sqrt, "log": torch.log, "exp": torch.exp, "sin": torch.sin,
        "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu,
        "neg": torch.neg, "abs": torch.abs, "elu": F.elu, "gelu_erf": F.gelu, "hardswish": F.hardswish,
        "hardsigmoid": F.hardsigmoid, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
        "expm1": torch.expm1, "softplus": F.softplus, "sgn": torch.sign,
        "soft_max": lambda a: torch.softmax(a, -1),
        "norm": lambda a, eps: F.layer_norm(a, a.shape[-1:], eps=eps),
        "rms_norm": rms_norm,
        "sum_rows": lambda a: a.sum(-1, keepdim=True),
        "cumsum": lambda a: torch.cumsum(a, -1),
        "mul_mat": lambda a, b: torch.matmul(b, a.transpose(-1, -2)),
    }


@functools.lru_cache(maxsize=1)
def _ops() -> dict[str, Callable[..., Any]]:
    return _table() if available() else {}


def has(op: str) -> bool:
    return available() and op in OPS


def run(op: str, args: list[Any], n_threads: int = 1) -> np.ndarray:
    """torch's result for the reference's arguments (arrays become float32 tensors;
    scalars pass as they are), computed on ``n_threads`` of torch's threads (the sweep's
    --threads: torch's default, every core in each worker, left the workers' OpenMP
    threads spinning against each other: a full sweep with torch on 2 cores took 19-21 s
    with --threads 1 against 12 s with --threads 2, whose workers wait passively)."""
    import torch  # type: ignore[import-not-found]
    if torch.get_num_threads() != n_threads:
        torch.set_num_threads(n_threads)
    targs = [torch.from_numpy(np.ascontiguousarray(a, np.float32)) if isinstance(a, np.ndarray) else a
             for a in args]
    with torch.no_grad():
        return _ops()[op](*targs).double().numpy()
