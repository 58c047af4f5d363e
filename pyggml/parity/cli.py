"""``pyggml parity``: sweep ops (and attention gradients) along independent paths and
compare them; ``pyggml parity --model PATH``: every named node of a GGUF model's graph
against float64; ``pyggml parity diff A B``: compare two saved sweeps; ``pyggml parity
merge PIECE...``: the report of a sweep run in shards (``--shard I/N``); ``pyggml parity
ulp``: every F16 and BF16 input (and a dense F32 sweep) of the elementwise ops, in ULPs;
``pyggml parity shrink CASE``: a failing op case shrunk, with Python and C reproducers."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
from typing import Any

from pyggml.parity.model import BAD, Case

__all__ = ["add_arguments", "main"]

KNOWN_PATHS = ("ggml", "ggml-ref", "cpu-backend", "blocked", "reference", "autodiff", "torch", "batched",
               "per-item")   # and the registered ones


def add_arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="parity_cmd")
    d = sub.add_parser("diff", help="compare two sweeps saved with --save (case by case, and with the reference)")
    d.add_argument("a", help="a .npz written by pyggml parity --save")
    d.add_argument("b", help="another one")
    d.add_argument("--tol", type=float, default=1e-7,
                   help="NMSE beyond which A and B disagree on a case A saved no tolerance for (default 1e-7)")
    d.add_argument("--json", metavar="F", help="write the differences and a summary per op as JSON")
    d.add_argument("--limit", type=int, default=40, help="rows of the table (default 40)")
    m = sub.add_parser("merge", help="join the --json reports of the N shards of one sweep (--shard I/N) into one")
    m.add_argument("pieces", nargs="+", help="the shards' reports (pyggml parity --shard I/N --json F)")
    m.add_argument("--json", metavar="F", help="write every row, the summary and the build as JSON")
    m.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    m.add_argument("--html", metavar="F", help="write a self-contained HTML report")
    k = sub.add_parser("shrink", help="shrink a failing op case (ggml beyond its tolerance from float64) to the "
                                      "smallest that still fails, and write Python and C reproducers")
    k.add_argument("case", help="op:NAME|TYPE|INDEX, as a row of pyggml parity --json names it (subject, type, index)")
    k.add_argument("--seed", type=int, default=0, help="the sweep's --seed (default 0)")
    k.add_argument("--out", default=".", metavar="DIR", help="where the reproducers go (default: here)")
    k.add_argument("--budget", type=int, default=600, help="candidates to compute at most (default 600)")
    u = sub.add_parser("ulp", help="every F16 and BF16 input (and a dense F32 sweep) of the one-input "
                                   "elementwise ops against correctly rounded results, in ULPs")
    u.add_argument("--op", action="append", default=[], metavar="NAME|GLOB", help="ops to sweep (default: all)")
    u.add_argument("--types", default="", help="comma-separated among F16,BF16,F32 (default: every type each takes)")
    u.add_argument("--json", metavar="F", help="write every row with its bound and reason as JSON")
    u.add_argument("--markdown", metavar="F", help="write the table, with the reasons, as Markdown")
    ap.add_argument("--op", action="append", default=[], metavar="NAME|GLOB",
                    help="subjects to check: an op name or glob (mul_mat, 'rope*'), 'grad:NAME', 'attention'; "
                         "repeatable; default: all")
    ap.add_argument("--types", default="", help="comma-separated ggml types (F32,F16,...); default: all")
    ap.add_argument("--paths", default="", help=f"comma-separated paths among {', '.join(KNOWN_PATHS)}; "
                                                "default: every path each subject has")
    ap.add_argument("--quick", action="store_true", help="two cases per subject and type (seconds)")
    ap.add_argument("--seed", type=int, default=0, help="another set of seeded samples (default 0: the tests')")
    ap.add_argument("--workers", type=int, default=None,
                    help="worker processes that isolate crashes (default: one per usable core; 0: in this "
                         "process, unisolated, each guarded run in a forked child)")
    ap.add_argument("--threads", type=int, default=1, help="ggml's threads per computation (default 1)")
    ap.add_argument("--rpc", metavar="HOST:PORT,...|auto", default=None,
                    help="add the path backend:RPC: every op on a server of ggml's RPC backend, one per worker (a "
                         "server serves one client at a time; at most that many workers run); 'auto' starts one "
                         "server per worker on 127.0.0.1 (pyggml.rpc.RPCServer) and stops them after")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a case is a timeout row")
    ap.add_argument("--no-probe", action="store_true",
                    help="skip the guarded run that looks for reads and writes past each tensor")
    ap.add_argument("--json", metavar="F", help="write every row, the summary and the build as JSON")
    ap.add_argument("--junit", metavar="F", help="write a JUnit XML report")
    ap.add_argument("--html", metavar="F", help="write a self-contained HTML report")
    ap.add_argument("--save", metavar="F.npz",
                    help="save what pyggml parity diff compares: every output, a large one close to the reference "
                         "as a digest of its values and its error against the reference")
    ap.add_argument("--save-whole", action="store_true",
                    help="with --save: keep every output's values, none as digests (the full sweep's file: 53 MB, not 8)")
    ap.add_argument("--list", action="store_true", help="list the subjects and their paths, then exit")
    ap.add_argument("--shrink", metavar="DIR", help="shrink each failing op case (ggml~reference) after the sweep "
                                                    "and write its Python and C reproducers into DIR")
    ap.add_argument("--shard", metavar="I/N", default=None,
                    help="only the cases of shard I of N (1 <= I <= N): a stable hash of each case's key, so N jobs "
                         "with I = 1..N run every case once; join their --json reports with pyggml parity merge")
    ap.add_argument("--model", metavar="PATH",
                    help="instead of the ops: a GGUF model of an architecture in pyggml.models, every named node "
                         "of pyggml's graph against float64 over the dequantized weights")
    ap.add_argument("--prompt", default=None, help="--model: the text to run (default: 'The capital of France is')")
    ap.add_argument("--nodes", type=int, default=10, help="--model: the worst nodes printed (0: all; default 10)")
    ap.add_argument("--verbose", action="store_true", help="print every row, not only the summary")


def _paths(ap: argparse.ArgumentParser, text: str) -> list[str] | None:
    if not text:
        return None
    names = [p.strip() for p in text.split(",") if p.strip()]
    from pyggml.parity.subjects import path_names
    unknown = [p for p in names if p not in path_names()]
    if unknown:
        ap.error(f"--paths: unknown {', '.join(unknown)} (known: {', '.join(path_names())})")
    if len(set(names)) != len(names):
        ap.error("--paths: a path compared with itself compares nothing")
    if len(names) < 2:
        ap.error("--paths: a comparison needs at least two paths")
    return names


class _Progress:
    """A progress line on a terminal (stderr), a line every 10 s otherwise."""

    def __init__(self, stream=None):
        stream = sys.stderr if stream is None else stream      # the one of now, not of import time
        self.stream, self.tty = stream, stream.isatty()
        self.t0 = self.last = time.monotonic()

    def __call__(self, done: int, total: int, case: Case) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write(f"\r\x1b[K[{done}/{total}] {case.subject} {case.label[:50]}")
            if done == total:
                self.stream.write("\r\x1b[K")
            self.stream.flush()
        elif now - self.last >= 10 or done == total:
            self.last = now
            self.stream.write(f"parity: {done}/{total} cases ({100 * done // total}%), {now - self.t0:.0f} s\n")
            self.stream.flush()

    def clear(self) -> None:
        """Take the progress line off a terminal (before a message of its own)."""
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _say(message: str) -> None:
    """One line on stderr, whatever ``message`` holds (a worker's stderr may have many)."""
    sys.stderr.write("pyggml parity: " + " | ".join(ln.strip() for ln in message.splitlines() if ln.strip()) + "\n")
    sys.stderr.flush()


# the files a run writes, by option and attribute of the parsed arguments
OUTPUTS = (("--json", "json"), ("--junit", "junit"), ("--save", "save"), ("--html", "html"))


def check_outputs(args: argparse.Namespace, options: tuple[tuple[str, str], ...] = OUTPUTS) -> str | None:
    """Why one of the output paths of ``args`` cannot be written (the first such, with
    its option), or None: checked before anything runs, so that a long sweep does not
    end in a report it cannot write."""
    from pyggml.parity import files
    for option, attr in options:
        path = getattr(args, attr, None)
        if path is None:
            continue
        why = files.check_writable(path)
        if why:
            return f"{option} {path}: {why}"
    return None


def main(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Exit status: 0 every comparison ok (or refused/skipped), 1 some went wrong (or the
    workers could not run), 2 bad arguments or an output that cannot be written, 130
    interrupted (the reports asked for are written, marked partial, with what finished)."""
    try:
        if getattr(args, "parity_cmd", None) == "diff":
            return _diff(args, ap)
        if getattr(args, "parity_cmd", None) == "merge":
            return _merge(args, ap)
        if getattr(args, "parity_cmd", None) == "ulp":
            return _ulp(args, ap)
        if getattr(args, "parity_cmd", None) == "shrink":
            return _shrink(args, ap)
        if args.model is not None:
            return _model(args, ap)
        if args.prompt is not None:
            ap.error("--prompt goes with --model")
        return _sweep(args, ap)
    except KeyboardInterrupt:            # before the sweep, or a second Ctrl-C while writing
        _say("interrupted")
        return 130


def _sweep(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """--rpc's servers around the sweep: PYGGML_RPC_ENDPOINT names the first here (the
    path's name, a sweep in this process), each worker its own."""
    if not args.rpc:
        return _sweep_run(args, ap, None)
    import os

    import pyggml
    from pyggml.parity.subjects import RPC_ENV

    if pyggml.rpc_protocol() is None:
        ap.error("--rpc: this pyggml was built without ggml's RPC backend")
    servers = []
    saved = os.environ.get(RPC_ENV)
    try:
        if args.rpc == "auto":
            from pyggml.parity import runner
            n = runner.default_workers() if args.workers is None else args.workers
            servers = [pyggml.rpc.RPCServer() for _ in range(max(1, n))]
            endpoints = [s.endpoint for s in servers]
        else:
            endpoints = [e.strip() for e in args.rpc.split(",") if e.strip()]
            for e in endpoints:
                try:
                    pyggml.rpc.handshake(e)
                except (pyggml.ArgumentError, pyggml.RPCError) as err:
                    ap.error(f"--rpc {e}: {err}")
        os.environ[RPC_ENV] = endpoints[0]
        return _sweep_run(args, ap, endpoints)
    finally:
        for srv in servers:
            srv.stop()
        if saved is None:
            os.environ.pop(RPC_ENV, None)
        else:
            os.environ[RPC_ENV] = saved


def _sweep_run(args: argparse.Namespace, ap: argparse.ArgumentParser, rpc: list[str] | None) -> int:
    import pyggml
    from pyggml.parity import report, runner, store
    from pyggml.parity.subjects import all_subjects

    paths = _paths(ap, args.paths)
    if args.workers is not None and args.workers < 0:
        ap.error("--workers must be >= 0")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.timeout <= 0:
        ap.error("--timeout must be > 0")
    if args.save_whole and not args.save:
        ap.error("--save-whole: it says how --save writes; give --save F.npz too")
    shard = None
    if args.shard is not None:
        try:
            shard = runner.parse_shard(args.shard)
        except ValueError as e:
            ap.error(f"--shard: {e}")
        if args.save:
            ap.error("--shard: pyggml parity merge joins --json reports, not --save files")
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    bad_types = [t for t in types if t not in pyggml.Type.__members__]
    if bad_types:
        ap.error(f"--types: unknown {', '.join(bad_types)}")
    if not args.list:
        why = check_outputs(args)
        if why:
            _say(f"error: {why}")
            return 2
    subjects = all_subjects(not args.no_probe)
    if args.list:
        for name, s in subjects.items():
            print(f"{name:32s} {', '.join(s.paths)}")
        return 0
    if paths is not None:
        usable = [n for n, s in subjects.items() if len(set(s.paths) & set(paths)) >= 2]
        if not usable:
            ap.error(f"--paths {','.join(paths)}: no subject has two of these paths")
    cases = runner.select(args.op, types, args.quick, args.seed, not args.no_probe)
    if paths is not None:
        cases = [c for c in cases if len(set(subjects[c.subject].paths) & set(paths)) >= 2]
    if not cases:
        ap.error("nothing to compare: no subject matches --op/--types (see --list)")
    total_cases = len(cases)
    if shard is not None:
        cases = [c for c in cases if runner.shard_of(c, shard[1]) == shard[0] - 1]
    workers = runner.default_workers() if args.workers is None else args.workers
    t0 = time.perf_counter()
    if shard is not None:
        print(f"shard {shard[0]}/{shard[1]}: {len(cases)} of the {total_cases} cases")
    progress = _Progress()
    stopped: tuple[int, str, str] | None = None      # exit status, why (the reports), the line for stderr
    try:
        rows, kept = runner.run_cases(cases, paths, workers, not args.no_probe, keep=bool(args.save),
                                      timeout=args.timeout, progress=progress, n_threads=args.threads, rpc=rpc)
    except runner.Interrupted as e:
        rows, kept = e.rows, e.kept
        stopped = (130, f"interrupted after {e.done} of {e.total} cases", f"interrupted: {e.done} of {e.total} "
                   "cases finished")
    except runner.WorkerError as e:
        rows, kept = e.rows, e.kept
        stopped = (1, f"stopped after {e.done} of {e.total} cases: {e}", f"error: {e}")
    progress.clear()
    elapsed = time.perf_counter() - t0
    if args.verbose:
        print(report.format_rows(rows))
        print()
    print(report.format_summary(rows, every=args.verbose))
    summ = runner.summarize(rows)
    counts = ", ".join(f"{k} {summ[k]}" for k in ("ok", "fail", "refused", "oob", "crashed", "timeout", "error",
                                                   "skipped") if summ[k])
    print(f"\n{summ['subjects']} subjects, {summ['cases']} cases, {summ['comparisons']} comparisons: {counts}; "
          f"worst NMSE against the reference {summ['worst_nmse']:.2e}; ggml {pyggml.ggml_version()}; {elapsed:.1f} s")
    ident = store.build_identity()
    untrusted = ident["untrusted_kernels"]
    if isinstance(untrusted, str):
        print(f"kernels: {untrusted}")
    elif untrusted:
        print(f"kernels not trusted to pyggml's rules (each graph proven in a forked child first): "
              f"{', '.join(untrusted)}")
    meta: dict[str, Any] = {"identity": ident, "quick": args.quick, "seed": args.seed,
                            "ops": args.op, "types": types, "paths": paths, "threads": args.threads,
                            "seconds": elapsed}
    if shard is not None:
        meta.update(shard=f"{shard[0]}/{shard[1]}", total_cases=total_cases, cases_selected=len(cases))
    if stopped:
        meta["partial"], meta["stopped"] = True, stopped[1]
        print(f"PARTIAL: the sweep was {stopped[1]}; the counts above and the reports are of the cases that finished")
        sys.stdout.flush()
    failed = False

    def write(option: str, path: str, fn: Any) -> Any:
        """``fn()`` (a writer, atomic): its value, or None and one line when it could not write."""
        nonlocal failed
        try:
            return fn()
        except OSError as e:             # checked before the sweep, but a disk fills up
            _say(f"error: {option} {path}: {e.strerror or e}")
            failed = True
            return None

    if args.json:
        write("--json", args.json, lambda: report.write_json(rows, args.json, meta))
    if args.junit:
        write("--junit", args.junit, lambda: report.write_junit(rows, args.junit, elapsed, partial=bool(stopped)))
    if args.save:
        # what two builds may differ by on each case: the tolerance between two ggml paths
        meta["tolerances"] = {c.key: subjects[c.subject].tolerance(c, "ggml", "ggml-ref") for c in cases
                              if c.key in kept}
        # what names each case across builds (parity diff matches cases by these, not by index)
        meta["labels"] = {c.key: c.label for c in cases if c.key in kept}
        n = write("--save", args.save,
                  lambda: store.save(args.save, kept, meta, whole_max=None if args.save_whole else store.WHOLE_MAX))
        if n is not None:
            print(f"saved {n[0]} outputs of {len(kept)} cases to {args.save}"
                  + (f" ({n[1]} large ones as digests and errors against the reference)" if n[1] else ""))
    if args.html:
        from pyggml.parity import html
        write("--html", args.html, lambda: html.write_html(rows, args.html, meta))
    if args.shrink and not stopped:
        _shrink_failures(rows, args)
    if stopped:
        _say(stopped[2] + ("; the reports written are partial" if any((args.json, args.junit, args.save, args.html))
                           and not failed else ""))
        return stopped[0]
    if failed:
        return 2
    return 1 if any(r.verdict in BAD for r in rows) else 0


def _shrink_failures(rows: list, args: argparse.Namespace) -> None:
    """--shrink DIR: each failing ggml~reference row of an op, shrunk, its reproducers in DIR."""
    from pyggml.errors import GGMLError
    from pyggml.parity import shrink
    todo = [r for r in rows if r.verdict == "fail" and r.subject.startswith("op:") and (r.a, r.b) == ("ggml", "reference")]
    if not todo:
        print("--shrink: no failing op case (ggml~reference) to shrink")
        return
    for r in todo:
        key = f"{r.subject}|{r.type}|{r.index}"
        try:
            sh = shrink.shrink_case(key, args.seed)
        except GGMLError as e:              # (it passed when computed again, alone)
            print(f"--shrink {key}: {e}")
            continue
        paths = shrink.write(sh, args.shrink, key.replace("op:", "").replace("|", "-"))
        print(f"--shrink {key}: {sh.elements_before} -> {sh.elements_after} input elements: {', '.join(paths)}")


def _model(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """pyggml parity --model PATH: one row per named node of the model's graph."""
    import pyggml
    from pyggml.errors import GGMLError
    from pyggml.parity import models, store

    if args.op or args.types or args.paths or args.quick or args.save or args.save_whole or args.list or args.shrink:
        ap.error("--model checks one model's nodes: --op, --types, --paths, --quick, --save and --list do not apply")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if not os.path.exists(args.model):
        ap.error(f"--model: no such file {args.model}")
    why = check_outputs(args, (("--json", "json"), ("--junit", "junit"), ("--html", "html")))
    if why:
        _say(f"error: {why}")
        return 2
    t0 = time.perf_counter()
    try:
        rows, meta = models.model_rows(args.model, args.prompt or models.DEFAULT_PROMPT, args.threads)
    except GGMLError as e:         # not a GGUF, or an architecture pyggml.models has not written
        _say(f"error: --model {args.model}: {e}")
        return 2
    elapsed = time.perf_counter() - t0
    meta.update(identity=store.build_identity(), seconds=elapsed)
    print(f"{meta['architecture']} ({', '.join(meta['types'])}), {len(meta['tokens'])} tokens of "
          f"{meta['prompt']!r}, {args.threads} thread(s): every named node against float64 over the "
          f"dequantized weights, worst first (tolerance {meta['tolerance']:.0e})")
    print(models.format_nodes(rows, args.nodes))
    bad = [r for r in rows if r.verdict != "ok"]
    print(f"\n{len(rows)} nodes: {len(rows) - len(bad)} ok, {len(bad)} beyond the tolerance; next token as "
          f"float64's at {meta['next_token_agrees']} of {meta['positions']} positions; ggml "
          f"{pyggml.ggml_version()}; {elapsed:.1f} s")
    if not _write_reports(args, rows, meta, elapsed):
        return 2
    return 1 if bad else 0


def _write_reports(args: argparse.Namespace, rows: list, meta: dict[str, Any], elapsed: float) -> bool:
    """--json, --junit and --html of ``rows`` where asked; False when one could not be written
    (said on stderr)."""
    from pyggml.parity import html, report
    ok = True
    for option, path, fn in (("--json", args.json, lambda: report.write_json(rows, args.json, meta)),
                             ("--junit", args.junit, lambda: report.write_junit(rows, args.junit, elapsed)),
                             ("--html", args.html, lambda: html.write_html(rows, args.html, meta))):
        if path:
            try:
                fn()
            except OSError as e:
                _say(f"error: {option} {path}: {e.strerror or e}")
                ok = False
    return ok


def _merge(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """pyggml parity merge PIECE...: the report of the whole sweep from its shards'."""
    from pyggml.parity import merge, report, runner
    why = check_outputs(args, (("--json", "json"), ("--junit", "junit"), ("--html", "html")))
    if why:
        _say(f"error: {why}")
        return 2
    try:
        rows, meta = merge.merge(args.pieces)
    except merge.MergeError as e:
        _say(f"merge: {e}")
        return 2
    print(report.format_summary(rows))
    summ = runner.summarize(rows)
    counts = ", ".join(f"{k} {summ[k]}" for k in ("ok", "fail", "refused", "oob", "crashed", "timeout", "error",
                                                   "skipped") if summ[k])
    print(f"\n{meta['shards']} shards: {summ['subjects']} subjects, {meta['total_cases']} cases, "
          f"{summ['comparisons']} comparisons: {counts}; worst NMSE against the reference {summ['worst_nmse']:.2e}; "
          f"ggml {meta['identity'].get('ggml_version')}; {meta['seconds']:.1f} s in all")
    if meta["cpu_features_differ"]:
        print("note: the shards ran on CPUs with different instruction sets: "
              + " | ".join(",".join(f) for f in meta["cpu_features"]))
    if not _write_reports(args, rows, meta, meta["seconds"]):
        return 2
    return 1 if any(r.verdict in BAD for r in rows) else 0


def _shrink(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """pyggml parity shrink CASE: exit 0 with the reproducers written, 2 where the case
    does not fail (or is not an op case)."""
    from pyggml.errors import GGMLError
    from pyggml.parity import shrink
    try:
        sh = shrink.shrink_case(args.case, args.seed, args.budget)
    except GGMLError as e:
        _say(str(e))
        return 2
    stem = args.case.replace("op:", "").replace("|", "-")
    paths = shrink.write(sh, args.out, stem)
    shapes = [tuple(a.value.shape) for a in sh.sample.args if hasattr(a, "layout")]
    print(f"{args.case}: shrunk from {sh.elements_before} to {sh.elements_after} input elements {shapes} in "
          f"{sh.tries} tries; NMSE {sh.nmse:.3g} > {sh.tol:g} still")
    for p in paths:
        print(f"  {p}")
    if len(paths) == 1:
        print("  (no C reproducer: a type other than F32, F16, I32, or a builder of pyggml's own)")
    return 0


def _ulp(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """pyggml parity ulp: exit 1 where an op's error is beyond its bound (or its NaNs
    differ unexplained), 2 for bad arguments or an output that cannot be written."""
    import pyggml
    from pyggml.parity import ulp
    why = check_outputs(args, (("--json", "json"), ("--markdown", "markdown")))
    if why:
        _say(f"error: {why}")
        return 2
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    bad = [t for t in types if t not in ("F16", "BF16", "F32")]
    if bad:
        ap.error(f"ulp --types: {', '.join(bad)} (F16, BF16, F32)")
    unknown = [p for p in args.op if not any(fnmatch.fnmatchcase(o, p) for o in ulp.REFERENCES)]
    if unknown:
        ap.error(f"ulp --op: nothing matches {', '.join(unknown)} (ops: {', '.join(ulp.REFERENCES)})")
    t0 = time.perf_counter()
    rows = ulp.sweep(args.op or None, types or None)
    print(ulp.format_table(rows))
    beyond = [r for r in rows if not r.within]
    print(f"\n{len(rows)} ops x types, {sum(r.inputs for r in rows)} inputs: "
          f"{sum(r.max_ulp == 0 for r in rows)} correctly rounded everywhere, "
          f"{sum(0 < r.max_ulp <= 1 for r in rows)} within 1 ULP, {sum(r.max_ulp > 1 for r in rows)} beyond 1 ULP, "
          f"{len(beyond)} beyond their bound; ggml {pyggml.ggml_version()}; "
          f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ggml_version": pyggml.ggml_version(), "rows": [r.as_dict() for r in rows]}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(ulp.format_markdown(rows))
    return 1 if beyond else 0


def _diff(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    from pyggml.parity import files, store
    for p in (args.a, args.b):
        if not os.path.exists(p):
            ap.error(f"diff: no such file {p}")
    why = check_outputs(args, (("--json", "json"),))
    if why:
        _say(f"error: {why}")
        return 2
    meta_a, meta_b, diffs = store.diff(args.a, args.b, tol=args.tol)
    if not diffs:
        skipped = meta_a.get("not_comparable", [])
        ap.error("diff: the two files have no case and path in common"
                 + (f" ({len(skipped)} cases named alike drew other inputs)" if skipped else ""))
    text, beyond = store.format_diff(meta_a, meta_b, diffs, args.limit)
    print(text)
    if args.json:
        try:
            with files.atomic_write(args.json) as f:
                json.dump(store.to_json(meta_a, meta_b, diffs), f, indent=1)
        except OSError as e:
            _say(f"error: --json {args.json}: {e.strerror or e}")
            return 2
    return 1 if beyond else 0
