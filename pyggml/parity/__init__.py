"""Parity testing: run ggml ops along independent paths and compare them.

A *subject* is something to check (an op of the registry, ``op:NAME``; the gradients of
an op, ``grad:NAME``; the attention gradients, ``attention``; or your own), its *cases*
are seeded inputs, and its *paths* are independent ways to compute them:

``ggml``       the linked ggml's CPU kernel (with an out-of-bounds probe: the case first
               runs in a forked child with every tensor between guard pages);
``ggml-ref``   the same with the CPU backend's reference implementations
               (``ggml_cplan.use_ref``);
``reference``  float64 NumPy, written from ggml's semantics (:mod:`pyggml.opinfo`);
``autodiff``   ggml's own backward pass (gradient subjects; attention);
``torch``      torch on the CPU, where it is installed and has the op.

Every pair of paths a case ran on is a row with a verdict (``ok``, ``fail``, ``refused``
for a known upstream defect, ``oob``, ``crashed``, ``timeout``, ``error``, ``skipped``)
and, when it went wrong, a standalone reproducer. Cases run in worker processes, so a
crash inside ggml is a row, not the end of the sweep.

From Python, with a subject of your own::

    import numpy as np
    from pyggml import parity

    def ggml_softplus(x): ...                     # your op, computed with pyggml
    parity.register_subject(parity.FunctionSubject(
        "my_softplus",
        inputs=lambda rng: (rng.standard_normal((4, 8)).astype(np.float32),),
        paths={"ggml": ggml_softplus, "reference": lambda x: np.logaddexp(0, x.astype(float))}))
    rows = parity.check("my_softplus")
    assert all(r.verdict == "ok" for r in rows)

A path of your own for the registry's ops (``register_path``): a function of the op's
OpInfo, a sample and a thread count, compared with every other path on every case::

    from pyggml.opinfo import harness
    parity.register_path("ggml-2threads", lambda info, sample, n: harness.compute(info, sample, 2)[0],
                         ops=["mul_mat*"])

From the command line: ``pyggml parity --help``.
"""

from __future__ import annotations

from typing import Iterable

from pyggml.errors import ArgumentError

from pyggml.parity.model import BAD, VERDICTS, Case, FunctionSubject, Outcome, Row, Subject
from pyggml.parity.runner import check_case, run_cases, select, summarize
from pyggml.parity.subjects import all_subjects, register_path, register_subject

__all__ = ["BAD", "VERDICTS", "Case", "FunctionSubject", "Outcome", "Row", "Subject", "all_subjects", "check",
           "check_case", "register_path", "register_subject", "run_cases", "select", "summarize"]


def check(ops: str | Iterable[str] = (), paths: Iterable[str] | None = None, quick: bool = False, seed: int = 0,
          types: Iterable[str] = (), workers: int = 0, probe: bool = True) -> list[Row]:
    """Check the subjects matching ``ops`` (names or globs; all if empty) and return
    the rows. ``workers=0`` (the default here) computes in this process."""
    if isinstance(ops, str):
        ops = [ops]
    cases = select(ops, types, quick, seed, probe)
    if not cases:
        raise ArgumentError(f"no subject matches {list(ops)}")
    rows, _ = run_cases(cases, paths, workers, probe)
    return rows
