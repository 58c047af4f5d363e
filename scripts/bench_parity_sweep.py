#!/usr/bin/env python3
"""The parity sweep's time with its proofs in a forked child per proof
(``PYGGML_PARITY_PROOF=fork``) and in the workers themselves (the default), side by side in
one run: each round runs both, in alternating order; the medians of wall time and of CPU
time (user + system of the sweep and its workers), and their ratios, with the CPU model.

    python scripts/bench_parity_sweep.py                 # --quick sweeps, 5 rounds
    python scripts/bench_parity_sweep.py --full -r 3     # full sweeps
    python scripts/bench_parity_sweep.py --dry-run       # one round of one op (a test)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from pyggml._machine import cpu_model, usable_cores

MODES = ("fork", "in-process")


def one(mode: str, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the sweep and its workers) of one sweep."""
    env = dict(os.environ)
    env.pop("PYGGML_PARITY_PROOF", None)
    if mode == "fork":
        env["PYGGML_PARITY_PROOF"] = "fork"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pyggml", "parity", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--full", action="store_true", help="full sweeps (default: --quick)")
    ap.add_argument("--paths", default="", help="the sweep's --paths (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="one round of one op's cases: the script's test")
    a = ap.parse_args(argv)
    args = [] if a.full else ["--quick"]
    if a.paths:
        args += ["--paths", a.paths]
    rounds = a.rounds
    if a.dry_run:
        args, rounds = ["--quick", "--op", "add", "--paths", "ggml,reference"], 1
    res: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            res[mode].append(one(mode, args))
    print(f"CPU: {cpu_model()}, {usable_cores()} usable cores; sweep: pyggml parity {' '.join(args)}; "
          f"{rounds} round(s), medians")
    med = {m: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for m, v in res.items()}
    for m in MODES:
        print(f"  {m:<11} wall {med[m][0]:7.2f} s   CPU {med[m][1]:7.2f} s")
    print(f"  in-process / fork: wall {med['in-process'][0] / med['fork'][0]:.2f}, "
          f"CPU {med['in-process'][1] / med['fork'][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
