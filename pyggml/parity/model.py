"""What a parity sweep is made of: subjects, their cases, the paths that compute them,
and the rows that compare two paths on one case.

A *subject* is something to check: one registry op (``op:NAME``), the gradients ggml's
autodiff gives for one op (``grad:NAME``), the attention gradients (``attention``), or
one a user registers. Its *cases* are seeded inputs; its *paths* are independent ways to
compute a case's result (``ggml``, ``ggml-ref``, ``reference``, ``autodiff``, ``torch``).
Every pair of paths a case ran on gives a *row* with a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

from pyggml.opinfo.harness import nmse

__all__ = ["BAD", "NOT_APPLICABLE", "Case", "Outcome", "Row", "Subject", "VERDICTS", "compare_outputs", "nmse"]

# ok: within tolerance; fail: beyond it (or a declared defect that did not show);
# refused: pyggml refused the case for a known upstream defect (a reported gap);
# oob: the guarded run saw a read or write past a tensor; crashed / timeout: the
# worker computing the case died or hung; error: an exception a path should not raise;
# skipped: a path this ggml (or this machine) cannot run the case on.
VERDICTS = ("ok", "fail", "refused", "oob", "crashed", "timeout", "error", "skipped")
BAD = frozenset({"fail", "oob", "crashed", "timeout", "error"})
# an Outcome's verdict (never a row's) for a path that does not apply to the case (a
# relation whose input the case lacks, e.g. no non-contiguous argument): its pairs give no row
NOT_APPLICABLE = "n/a"


@dataclasses.dataclass(frozen=True)
class Case:
    """One seeded input of a subject: ``index`` into what the subject's generator
    draws from ``seed`` for ``type`` (a ggml type name, or "" where types do not apply)."""
    subject: str
    type: str
    index: int
    seed: int
    label: str

    @property
    def key(self) -> str:
        return f"{self.subject}|{self.type}|{self.index}"


@dataclasses.dataclass
class Outcome:
    """What one path gave on one case: arrays, or why not (a verdict and its detail)."""
    arrays: list[np.ndarray] | None = None
    verdict: str = "ok"
    detail: str = ""
    defect: str = ""


@dataclasses.dataclass
class Row:
    subject: str
    op: str
    case: str
    type: str
    index: int
    seed: int
    a: str
    b: str
    nmse: float | None
    max_abs: float | None
    tol: float | None
    verdict: str
    detail: str = ""
    repro: str = ""
    defect: str = ""         # the registry defect (pyggml.defects) a refused/oob row is about

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("nmse", "max_abs"):
            if d[k] is not None and not math.isfinite(d[k]):
                d[k] = str(d[k])
        return d


class Subject:
    """A thing to check. Subclasses (or instances built with ``make``) give:

    ``name``      unique, e.g. ``"op:soft_max_ext"``; ``op`` the op it is about;
    ``paths``     the paths it can be computed along (``reference`` is the oracle);
    ``cases(seed, quick)`` the seeded cases (cheap: descriptions, not inputs);
    ``compute(case, path, n_threads)`` an :class:`Outcome` (``n_threads``: for ggml's
                  paths; others may ignore it);
    ``tolerance(case, a, b)`` the NMSE bound between paths a and b on a case;
    ``compares(a, b)`` whether a row compares paths a and b (all pairs by default);
    ``repro(case)`` Python source that rebuilds the case standalone;
    ``on_request`` only when a selection names it (not in a sweep of everything).
    """

    name: str = ""
    op: str = ""
    paths: tuple[str, ...] = ()
    # checked only when a selection (--op) names it, not in a sweep of everything (a subject
    # too slow for every sweep)
    on_request: bool = False

    def cases(self, seed: int, quick: bool) -> list[Case]:
        raise NotImplementedError

    def compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        raise NotImplementedError

    def tolerance(self, case: Case, a: str, b: str, n_threads: int = 1) -> float:
        return 1e-7 if b == "reference" else (2 * math.sqrt(1e-7)) ** 2

    def compares(self, a: str, b: str) -> bool:
        """Whether paths a and b compute the same thing (every pair does, by default)."""
        return True

    def repro(self, case: Case) -> str:
        return ""


class FunctionSubject(Subject):
    """A subject from plain functions: ``inputs(rng) -> tuple`` and one function per
    path taking those inputs and returning an array (or a sequence of arrays)."""

    def __init__(self, name: str, inputs: Callable[[np.random.Generator], Sequence[Any]],
                 paths: dict[str, Callable[..., Any]], n_cases: int = 8, tol: float = 1e-7,
                 op: str = ""):
        self.name, self.op = name, op or name
        self._inputs, self._paths, self._n, self._tol = inputs, dict(paths), n_cases, tol
        self.paths = tuple(paths)

    def cases(self, seed: int, quick: bool) -> list[Case]:
        n = min(self._n, 2) if quick else self._n
        return [Case(self.name, "", i, seed, f"case {i}") for i in range(n)]

    def compute(self, case: Case, path: str, n_threads: int = 1) -> Outcome:
        rng = np.random.default_rng([case.seed, case.index])
        out = self._paths[path](*self._inputs(rng))
        arrays = [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]
        return Outcome(arrays)

    def tolerance(self, case: Case, a: str, b: str, n_threads: int = 1) -> float:
        return self._tol if b == "reference" else (2 * math.sqrt(self._tol)) ** 2


def compare_outputs(xs: list[np.ndarray], ys: list[np.ndarray], exact: bool = False) -> tuple[float, float]:
    """Worst NMSE and max abs difference over paired arrays (shapes must agree, up to
    leading ones); ``exact`` (integer results): 0 or inf."""
    if len(xs) != len(ys):
        return math.inf, math.inf
    worst = max_abs = 0.0
    for x, y in zip(xs, ys):
        x, y = np.asarray(x), np.asarray(y)
        if x.size != y.size:
            return math.inf, math.inf
        x, y = x.reshape(-1), y.reshape(-1)
        if x.dtype.kind == "f" and y.dtype.kind == "f" and np.array_equal(x, y, equal_nan=True):
            pass                # the same values, NaNs at the same places: no error
        elif exact or x.dtype.kind in "iub" or y.dtype.kind in "iub":
            same = np.array_equal(x, y, equal_nan=x.dtype.kind == "f" and y.dtype.kind == "f")
            worst = max(worst, 0.0 if same else math.inf)
        else:
            worst = max(worst, nmse(x, y))
        fin = np.isfinite(np.asarray(x, np.float64)) & np.isfinite(np.asarray(y, np.float64))
        if fin.any():
            max_abs = max(max_abs, float(np.max(np.abs(np.asarray(x, np.float64)[fin] - np.asarray(y, np.float64)[fin]))))
    return worst, max_abs
