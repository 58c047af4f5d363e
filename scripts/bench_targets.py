#!/usr/bin/env python3
"""The project's performance targets in one run: every benchmark script, one after another
on this machine, then one table of target, measured, met.

The targets are issue 20's (attention backward against torch and the FMA peak, two threads
against one, the parity sweep's time, the binding's overhead against C, training against
torch). Every ratio is measured side by side inside its own benchmark script (systems
alternated round by round, medians: see each script); this one runs them in sequence, keeps
their logs and JSON in ``--out``, and reads the verdicts from that JSON. The parity sweep has
no script of its own here: it is ``pyggml parity`` timed whole (wall time of the command,
median of ``--sweep-rounds``; ``--threads 1`` and ``2`` alternated; "without torch" is every
path but torch).

Run it on an otherwise idle machine; it takes 15-25 minutes with the defaults on 2 cores:

    python scripts/bench_targets.py [--repeat 5] [--out DIR]
    python scripts/bench_targets.py --dry-run        # every step at its smallest (the test)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

SCRIPTS = Path(__file__).resolve().parent


def _attention(repeat: int, dry: bool, ns: str, more: list[str]) -> list[str]:
    size = ["--quick", "--repeat", "1"] if dry else ["--N", ns, "--repeat", str(repeat)]
    return ["bench_flash_attn_back.py", *size, "--threads", "1,2", "--no-memory", "--reference-max-n", "0", *more]


def steps(repeat: int, dry: bool) -> dict[str, list[str]]:
    """Each benchmark's command (a script of this folder and its arguments, without --json)."""
    return {
        "attention": _attention(repeat, dry, "1024,2048,4096", []),       # 8, 4, 2 heads
        "attention_one_head": _attention(repeat, dry, "1024,2048", ["--heads", "1", "--node"]),
        "overhead": ["bench_overhead.py"] + (["--small", "50", "-n", "500", "--rounds", "1", "--alternations", "1"]
                                             if dry else ["--alternations", "3"]),
        "train": ["bench_train.py", "--rounds", "1" if dry else str(max(repeat, 5))] +
                 (["--models", "digits"] if dry else []),
    }


def sweep_configs(dry: bool, torch: bool) -> dict[str, list[str]]:
    """The parity sweeps timed, by name: --quick and full, without torch's path and with it."""
    from pyggml.parity.cli import KNOWN_PATHS
    no_torch = ["--paths", ",".join(p for p in KNOWN_PATHS if p != "torch")]
    configs = {"quick_no_torch": ["--quick", *no_torch], "full_no_torch": no_torch}
    if torch:
        configs.update({"quick_torch": ["--quick"], "full_torch": []})
    if dry:         # one op's quick cases
        configs = {k: ["--op", "add", "--quick", *v[1:]] if v[:1] == ["--quick"] else ["--op", "add", "--quick", *v]
                   for k, v in configs.items() if k.startswith("quick")}
    return configs


def time_sweeps(configs: dict[str, list[str]], rounds: int) -> dict[str, Any]:
    """Wall seconds of ``pyggml parity`` per config and thread count (1 and 2 alternated, the
    order swapped every round); the medians, and the median of the per-round ratios 2 / 1;
    the same of the CPU seconds the sweep and its workers took (where the cores are busy
    either way, what more CPU a count takes bounds its wall time)."""
    walls: dict[str, dict[int, list[float]]] = {k: {1: [], 2: []} for k in configs}
    cpus: dict[str, dict[int, list[float]]] = {k: {1: [], 2: []} for k in configs}
    with tempfile.TemporaryDirectory() as cwd:
        for i in range(rounds):
            for name, args in configs.items():
                for threads in ((1, 2) if i % 2 == 0 else (2, 1)):
                    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                    proc = subprocess.run([sys.executable, "-m", "pyggml", "parity", *args, "--threads", str(threads)],
                                          cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    walls[name][threads].append(time.perf_counter() - t0)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)     # the sweep and its workers
                    cpus[name][threads].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
                    if proc.returncode != 0:
                        raise SystemExit(f"bench_targets: pyggml parity {' '.join(args)} --threads {threads} "
                                         f"exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return {name: {"args": configs[name], "wall_s": {str(t): statistics.median(v) for t, v in w.items()},
                   "rounds": {str(t): v for t, v in w.items()},
                   "threads2_over_1": statistics.median(b / a for a, b in zip(w[1], w[2])),
                   "cpu_s": {str(t): v for t, v in cpus[name].items()},
                   "cpu_threads2_over_1": statistics.median(b / a for a, b in zip(cpus[name][1], cpus[name][2]))}
            for name, w in walls.items()}


def _fma(q: Any, isa: str) -> None:
    from pyggml import _attn
    q.put(statistics.median(_attn.fma_peak(isa, 0.3, 1) or 0.0 for _ in range(3)))


def machine_scaling(rounds: int) -> dict[str, Any]:
    """What two cores give this machine where nothing is shared but the machine: the FMA peak
    loop in two processes at once against one alone, each round (the rates, GFLOP/s per
    CPU-second, summed over the two); the ceiling beside the kernels' two-thread gains."""
    import multiprocessing as mp
    from pyggml import _attn
    isa = _attn.set_isa("auto")
    if isa == "portable":
        return {"isa": isa, "two_over_one": []}
    ctx = mp.get_context("spawn")
    one: list[float] = []
    two: list[float] = []
    for _ in range(rounds):
        q = ctx.Queue()
        for n, into in ((1, one), (2, two)):
            ps = [ctx.Process(target=_fma, args=(q, isa)) for _ in range(n)]
            for p in ps:
                p.start()
            into.append(sum(q.get() for _ in ps))
            for p in ps:
                p.join()
    return {"isa": isa, "one_gflops": one, "two_gflops": two, "two_over_one": [b / a for a, b in zip(one, two)]}


def _rows(doc: dict | None, min_n: int) -> list[dict]:
    return [r for r in (doc or {}).get("rows", []) if r["N"] >= min_n]


def _gains(doc: dict | None, min_n: int, kernels: tuple[str, ...]) -> list[float]:
    return [v for r in _rows(doc, min_n) if r["threads"] == 2
            for k, v in r.get("gain_over_1_thread", {}).items() if k in kernels]


def targets(docs: dict[str, Any], min_n: int = 1024) -> list[dict[str, Any]]:
    """Each target: its issue item, words, values measured (one per cell), the bound and its
    sense, and met (None where nothing was measured). Attention targets take N >= min_n."""
    att, one = docs.get("attention"), docs.get("attention_one_head")
    t1 = [r for r in _rows(att, min_n) if r["threads"] == 1]
    sweep, over, train = docs.get("sweep", {}), docs.get("overhead") or {}, (docs.get("train") or {}).get("models", {})

    def vals(rows: list[dict], key: str, masked: bool | None = None) -> list[float]:
        return [r[key] for r in rows if r.get(key) is not None and (masked is None or r["masked"] == masked)]

    def shares(masked: bool | None, bound: float) -> tuple[list[float], list[float]]:
        """What a torch target asks, and the ceiling of the kernel's own products, as shares
        of the FMA peak measured in the same rounds: bound x torch's rate, and the tile
        products' rate in cache (each a median of per-round quotients)."""
        rows = [r for r in t1 if r.get("peak_rounds") and "torch" in r["cpu_rounds"]
                and (masked is None or r["masked"] == masked)]
        need = [bound * statistics.median(r["flops"] / t / 1e9 / p for t, p in
                                          zip(r["cpu_rounds"]["torch"], r["peak_rounds"])) for r in rows]
        tile = [statistics.median(c / p for c, p in zip(r["tile_rounds"], r["peak_rounds"])) for r in rows]
        return need, tile

    # each: item, words, values, bound, sense, and for the attention targets bounded by the
    # FMA peak (masked rows or not or all, whether the bound is a multiple of torch's rate)
    spec: list[tuple[Any, ...]] = [
        ("2", "blocked (no saved statistics) / torch, unmasked, 1 thread",
         lambda: vals(t1, "blocked_over_torch", False), 1.0, ">=", (False, True)),
        ("2", "blocked+lse / torch, unmasked, 1 thread", lambda: vals(t1, "lse_over_torch", False), 1.4, ">=",
         (False, True)),
        ("2", "blocked+lse / torch, masked, 1 thread", lambda: vals(t1, "lse_over_torch", True), 1.8, ">=",
         (True, True)),
        ("2", "blocked+lse, share of the measured FMA peak", lambda: vals(t1, "lse_over_peak"), 0.9, ">=",
         (None, False)),
        ("2", "the machine: an FMA loop on 2 cores / on 1 (rates summed; no target)",
         lambda: (docs.get("machine") or {}).get("two_over_one", []), 1.8, "info"),
        ("2", "2 threads / 1 (wall), blocked and blocked+lse, several heads",
         lambda: _gains(att, min_n, ("blocked", "blocked+lse")), 1.8, ">="),
        ("2", "2 threads / 1 (wall), blocked and blocked+lse, one head (B*KVH = 1)",
         lambda: _gains(one, min_n, ("blocked", "blocked+lse")), 1.8, ">="),
        ("2", "2 threads / 1 (wall), the graph node, one head", lambda: _gains(one, min_n, ("node",)), 1.8, ">="),
        ("4", "full sweep without torch, s (--threads 1)", lambda: _sweep(sweep, "full_no_torch"), 10.0, "<="),
        ("4", "full sweep with torch, s (--threads 1)", lambda: _sweep(sweep, "full_torch"), 30.0, "<="),
        ("4", "--quick without torch, s (--threads 1)", lambda: _sweep(sweep, "quick_no_torch"), 3.0, "<="),
        ("4", "--quick with torch, s (--threads 1)", lambda: _sweep(sweep, "quick_torch"), 10.0, "<="),
        ("4", "--threads 2 / --threads 1, wall (each sweep above)",
         lambda: [s["threads2_over_1"] for s in sweep.values()], 1.0, "<="),
        ("4", "CPU seconds of the sweep and its workers, --threads 2 / --threads 1 (no target)",
         lambda: [s["cpu_threads2_over_1"] for s in sweep.values() if "cpu_threads2_over_1" in s], 1.0, "info"),
        ("5", "tiny graph cycle, pyggml / the C program",
         lambda: [v for k, v in over.get("pyggml_over_c", {}).items() if k.startswith("cycle@")], 2.0, "<="),
        ("5", "tiny graph cycle, pyggml / the same C in pyggml's process",
         lambda: [v for k, v in over.get("pyggml_over_c", {}).items() if k.startswith("cycle_in_process@")],
         2.0, "<="),
        ("6", "digits classifier epoch, torch time / pyggml time",
         lambda: [train["digits"]["torch_over_pyggml"]] if "digits" in train else [], 1.0, ">="),
        ("6", "784-512-10 MLP epoch, torch time / pyggml time (CPU backend)",
         lambda: [train["mlp784"]["torch_over_pyggml"]] if "mlp784" in train else [], 1.0, ">="),
    ]
    out = []
    for item, words, get, bound, sense, *peak in spec:
        v = get()
        met = None if not v or sense == "info" else all((x >= bound) if sense == ">=" else (x <= bound) for x in v)
        row = {"item": item, "target": words, "sense": sense, "bound": bound, "values": v, "met": met}
        if peak:        # what the target asks of the peak beside what the tile products reach
            masked, of_torch = peak[0]
            need, tile = shares(masked, bound)
            row["needs_peak"], row["tile_peak"] = (need if of_torch else [bound] * len(tile)), tile
        out.append(row)
    return out


def _sweep(sweep: dict, name: str) -> list[float]:
    return sweep[name]["rounds"]["1"] if name in sweep else []


def markdown(rows: list[dict[str, Any]]) -> str:
    def span(v: list[float], median: bool = True) -> str:
        return f"{min(v):.2f}-{max(v):.2f}" + (f", {statistics.median(v):.2f}; {len(v)}" if median else "")

    lines = ["| item | target | bound | measured (min-max, median; cells) | met | asks of the FMA peak "
             "| tile products reach |", "|---|---|---|---|---|---|---|"]
    for t in rows:
        v = t["values"]
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        peak = (f"{span(t['needs_peak'], False)} | {span(t['tile_peak'], False)}" if t.get("tile_peak") else "- | -")
        bound = "-" if t["sense"] == "info" else f"{t['sense']} {t['bound']:g}"
        lines.append(f"| {t['item']} | {t['target']} | {bound} | "
                     f"{span(v) if v else 'not measured'} | {met} | {peak} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="the benchmarks' rounds (attention: --repeat)")
    ap.add_argument("--sweep-rounds", type=int, default=3)
    ap.add_argument("--out", help="keep every step's log and JSON here (default: a temporary folder)")
    ap.add_argument("--dry-run", action="store_true", help="every step at its smallest; no verdict is meaningful")
    args = ap.parse_args()
    import pyggml
    from pyggml._machine import cpu_model, usable_cores
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-targets-"))
    out.mkdir(parents=True, exist_ok=True)
    info = pyggml.build_info()
    head = {"command": sys.argv, "cpu": cpu_model(), "cores": usable_cores(), "date": time.strftime("%Y-%m-%d"),
            "pyggml": pyggml.__version__, "ggml": pyggml.ggml_version(), "torch": has_torch,
            "build": {k: info[k] for k in ("native", "openmp", "llamafile")}, "load": {}, "seconds": {}}
    print("$ " + " ".join(["python"] + sys.argv))
    print(f"CPU: {head['cpu']}, {head['cores']} usable core(s); pyggml {head['pyggml']}, ggml {head['ggml']} "
          f"(item 1, the build: native={info['native']}, openmp={info['openmp']}, llamafile={info['llamafile']}); "
          f"logs and JSON in {out}", flush=True)
    docs: dict[str, Any] = {}
    rounds = 1 if args.dry_run else args.repeat
    head["load"]["machine"], t0 = os.getloadavg()[0], time.perf_counter()
    print(f"[machine] the FMA loop on 1 core and on 2 at once, {rounds} rounds", flush=True)
    docs["machine"] = machine_scaling(rounds)
    head["seconds"]["machine"] = time.perf_counter() - t0
    todo = steps(args.repeat, args.dry_run)
    if not has_torch:
        todo.pop("train")
    for name, cmd in todo.items():
        js = out / f"{name}.json"
        argv = [sys.executable, str(SCRIPTS / cmd[0]), *cmd[1:], "--json", str(js)]
        load, t0 = os.getloadavg()[0], time.perf_counter()
        print(f"[{name}] {' '.join(['python', 'scripts/' + cmd[0], *cmd[1:]])} (load {load:.2f})", flush=True)
        with open(out / f"{name}.log", "w") as log:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=out).returncode
        head["load"][name], head["seconds"][name] = load, time.perf_counter() - t0
        if rc != 0:
            print(f"bench_targets: step {name} exited {rc}; its log: {out / (name + '.log')}", file=sys.stderr)
            return 1
        docs[name] = json.loads(js.read_text())
    head["load"]["sweep"], t0 = os.getloadavg()[0], time.perf_counter()
    print(f"[sweep] pyggml parity, {len(sweep_configs(args.dry_run, has_torch))} configurations x threads 1, 2 x "
          f"{1 if args.dry_run else args.sweep_rounds} rounds (load {head['load']['sweep']:.2f})", flush=True)
    docs["sweep"] = time_sweeps(sweep_configs(args.dry_run, has_torch), 1 if args.dry_run else args.sweep_rounds)
    head["seconds"]["sweep"] = time.perf_counter() - t0
    rows = targets(docs, min_n=0 if args.dry_run else 1024)
    (out / "targets.json").write_text(json.dumps({**head, "targets": rows, "docs": docs}, indent=1))
    print(f"\nCPU: {head['cpu']}; load before each step: " +
          ", ".join(f"{k} {v:.2f}" for k, v in head["load"].items()) + "\n")
    print(markdown(rows))
    print("\n(item 3: each step's log in the folder above names its command, the CPU, the measured FMA peak "
          "and the BLAS kernel; item 1 is the build line at the top)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
