"""Running a sweep: every case of every subject along the chosen paths, every pair of
paths compared. Cases run in worker processes (``workers >= 1``) so that one that
aborts, crashes or hangs inside ggml becomes a ``crashed`` / ``timeout`` row and the
sweep goes on; a worker takes cases in batches and is replaced only when it dies.
``workers=0`` runs in this process (for tests, and for the pytest plugin where the
sweep has subjects or paths of its own: :class:`WorkerPool` otherwise)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import multiprocessing as mp
import os
import signal
import tempfile
import time
from typing import Any, Callable, Iterable

import numpy as np

from pyggml.parity.model import BAD, NOT_APPLICABLE, Case, Outcome, Row, Subject, compare_outputs
from pyggml.parity.subjects import RPC_ENV, all_subjects

__all__ = ["Interrupted", "WorkerError", "WorkerPool", "check_case", "default_workers", "parse_shard", "run_cases", "select",
           "shard_of"]

Progress = Callable[[int, int, Case], None]


def select(ops: Iterable[str] = (), types: Iterable[str] = (), quick: bool = False, seed: int = 0,
           probe: bool = True, kinds: Iterable[str] = ("op", "grad", "attention", "quant", "user")) -> list[Case]:
    """The cases of the subjects whose op (or name) matches one of ``ops`` (fnmatch
    patterns; all if empty), of the given ggml ``types`` (all if empty)."""
    import fnmatch
    ops, types, kinds = list(ops), {t.upper() for t in types}, set(kinds)
    out = []
    for name, s in all_subjects(probe).items():
        kind = name.split(":")[0] if ":" in name else ("attention" if name == "attention" else "user")
        if kind not in kinds:
            continue
        if ops and not any(fnmatch.fnmatchcase(s.op, p) or fnmatch.fnmatchcase(name, p) for p in ops):
            continue
        if s.on_request and not any(fnmatch.fnmatchcase(name, p) for p in ops):
            continue        # (named by its own name: --op 'quant:*', not by its op's)
        for c in s.cases(seed, quick):
            if not types or c.type.upper() in types or not c.type:
                out.append(c)
    return out


def shard_of(case: Case, n: int) -> int:
    """The shard (0 to n - 1) ``case`` belongs to among ``n``: its key's sha256, so the same
    case lands in the same shard on every machine, run and Python (no salted hash()), and
    the n shards of one selection are disjoint and cover it."""
    return int.from_bytes(hashlib.sha256(case.key.encode()).digest()[:8], "big") % n


def parse_shard(text: str) -> tuple[int, int]:
    """"I/N" (1 <= I <= N) as (I, N); ValueError otherwise."""
    i, sep, n = text.partition("/")
    if not sep or not i.strip().isdigit() or not n.strip().isdigit() or not 1 <= int(i) <= int(n):
        raise ValueError(f"a shard is I/N with 1 <= I <= N, not {text!r}")
    return int(i), int(n)


def check_case(case: Case, paths: Iterable[str] | None = None, probe: bool = True,
               keep: bool = False, n_threads: int = 1) -> tuple[list[Row], dict[str, list[np.ndarray]]]:
    """Compute one case along its subject's paths (those of ``paths``, all if None) and
    compare every pair, the reference always as side b: the rows, and with ``keep``
    the arrays each path gave."""
    s = all_subjects(probe)[case.subject]
    names = [p for p in s.paths if paths is None or p in paths]
    outs: dict[str, Outcome] = {}
    for p in names:
        try:
            outs[p] = s.compute(case, p, n_threads)
        except Exception as e:          # a path's own bug: a row, not the end of the sweep
            outs[p] = Outcome(verdict="error", detail=f"{type(e).__name__}: {e}")
    rows = []
    repro = ""
    for a, b in _pairs(names, s):
        oa, ob = outs[a], outs[b]
        if NOT_APPLICABLE in (oa.verdict, ob.verdict):
            continue            # a relation that does not apply to this case: no row
        tol = s.tolerance(case, a, b, n_threads)
        bad = next((o for o in (oa, ob) if o.verdict != "ok"), None)
        if bad is not None:
            # the worse of the two sides decides (an error beats a refusal)
            order = {v: i for i, v in enumerate(("error", "fail", "oob", "refused", "skipped", "ok"))}
            bad = min((oa, ob), key=lambda o: order.get(o.verdict, 0))
            row = Row(s.name, s.op, case.label, case.type, case.index, case.seed, a, b, None, None, tol,
                      bad.verdict, bad.detail, defect=bad.defect)
        else:
            err, max_abs = compare_outputs(oa.arrays or [], ob.arrays or [], exact=(tol == 0.0))
            ok = err <= tol
            row = Row(s.name, s.op, case.label, case.type, case.index, case.seed, a, b, err, max_abs, tol,
                      "ok" if ok else "fail", "" if ok else f"NMSE {err:.3e} > {tol:.1e}")
        if row.verdict in BAD:
            repro = repro or s.repro(case)
            row.repro = repro
        rows.append(row)
    arrays = {p: o.arrays for p, o in outs.items() if keep and o.arrays is not None}
    return rows, arrays


def _pairs(names: list[str], s: Subject | None = None) -> list[tuple[str, str]]:
    out = []
    for a, b in itertools.combinations(names, 2):
        if s is not None and not s.compares(a, b):
            continue
        if a == "reference":
            a, b = b, a
        out.append((a, b))
    return out


def _crash_rows(case: Case, paths: Iterable[str] | None, verdict: str, detail: str, probe: bool) -> list[Row]:
    try:
        s: Subject | None = all_subjects(probe)[case.subject]
        assert s is not None
        names = [p for p in s.paths if paths is None or p in paths]
        repro = s.repro(case)
        op = s.op
    except Exception:                    # the subject itself is unknown here
        s, names, repro, op = None, ["?", "?"], "", case.subject
    pairs = _pairs(names, s) or [(names[0], names[0])]
    return [Row(case.subject, op, case.label, case.type, case.index, case.seed, a, b, None, None, None,
                verdict, detail, repro) for a, b in pairs]


# --- worker processes ------------------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped :func:`run_cases`: the workers are gone, and ``rows`` and ``kept``
    hold the cases that finished (``done`` of ``total``), as run_cases would return them."""

    def __init__(self, rows: list[Row], kept: dict[str, dict[str, list[np.ndarray]]], done: int, total: int):
        super().__init__(f"interrupted after {done} of {total} cases")
        self.rows, self.kept, self.done, self.total = rows, kept, done, total


class WorkerError(RuntimeError):
    """Workers kept dying before running any case (a broken install, something killing
    them): no case is to blame. ``rows``, ``kept``, ``done``, ``total`` as in :class:`Interrupted`."""

    def __init__(self, message: str, rows: list[Row], kept: dict[str, dict[str, list[np.ndarray]]], done: int,
                 total: int):
        super().__init__(message)
        self.rows, self.kept, self.done, self.total = rows, kept, done, total


# a worker that dies with no case running blames no case, and its cases go back; this
# many such deaths in a row with no case started in between end the sweep (WorkerError)
_IDLE_DEATHS = 3
# a worker that has not started its first case this many seconds after it was handed a
# batch (or ``timeout``, if longer) is stuck before any case (an import that hangs): it
# is killed, and counts as one of those deaths
_WORKER_START_S = 120.0


def _worker_main(conn, paths, probe, keep, n_threads, stderr_path, timeout=300.0):
    # Ctrl-C is the parent's to handle: it stops the workers and keeps what finished
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)                       # ggml's messages before an abort land here
    os.close(fd)
    # A worker is disposable: it proves each graph in itself, not in a child forked per
    # case (most of a sweep's time, before). The proof's time limit stays under the
    # case's, so that a kernel that spins is the proof's KernelTimeout, as in a child.
    # After a proof that found anything, a kernel was abandoned part way: the worker says
    # so ("retire") and goes, and the parent starts a fresh one for the rest.
    # (PYGGML_PARITY_PROOF=fork keeps the child per proof: a fallback, and the baseline of
    # scripts/bench_parity_sweep.py)
    from pyggml import _cpu
    _cpu._set_proof_in_process(os.environ.get("PYGGML_PARITY_PROOF", "") != "fork")
    _cpu.set_proof_timeout(min(_cpu.proof_timeout(), max(0.001, 0.8 * timeout)))
    # the subject table is built before the first case, so that its cost (imports, on a
    # loaded machine seconds) does not count against that case's timeout
    all_subjects(probe)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        for i, case in msg:
            conn.send(("start", i))
            rows, arrays = check_case(case, paths, probe, keep, n_threads)
            conn.send(("done", i, rows, arrays))
            if _cpu._proof_state_tainted():
                conn.send(("retire",))
                return


@contextlib.contextmanager
def _worker_environment(n_threads: int, endpoint: str | None = None):
    """The environment a worker starts with (spawn copies os.environ at start): with
    more than one ggml thread, OpenMP's threads sleep as soon as a computation ends
    (OMP_WAIT_POLICY=passive, unless the caller chose a policy). A sweep's computations
    are microseconds long, and libgomp's default spin after each one took the cores from
    the other workers: a full sweep on 2 cores with 2 workers of 2 threads took 108 s
    spinning, 10 s passive (8.9 s on 1 thread). ``endpoint``: the RPC server of the
    worker's ``backend:RPC`` path (PYGGML_RPC_ENDPOINT; a server serves one client at a
    time, so each worker has its own)."""
    saved = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", RPC_ENV)}
    if n_threads > 1 and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    if endpoint is not None:
        os.environ[RPC_ENV] = endpoint
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _in_main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _start_ignoring_sigint(proc: Any) -> None:
    """Start ``proc`` with SIGINT ignored from its first instruction (a terminal's Ctrl-C
    goes to the whole process group; a worker still importing would print a traceback).
    SIGINT is blocked meanwhile here, so one that comes is delivered after, not lost."""
    if not _in_main_thread() or signal.getsignal(signal.SIGINT) is None:
        proc.start()
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)      # inherited across exec, blocked or not
        try:
            proc.start()
        finally:
            signal.signal(signal.SIGINT, old)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class _SigintFlag:
    """While active (in the main thread, where Ctrl-C is not ignored), SIGINT sets
    ``hit`` instead of raising KeyboardInterrupt wherever the sweep happens to be."""

    def __init__(self) -> None:
        self.hit = False
        self._old: Any = None
        self._active = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.hit = True

    def __enter__(self) -> "_SigintFlag":
        if _in_main_thread():
            old = signal.getsignal(signal.SIGINT)
            if old not in (signal.SIG_IGN, None):
                self._old, self._active = old, True
                signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            signal.signal(signal.SIGINT, self._old)


class _Worker:
    def __init__(self, ctx: Any, paths: list[str] | None, probe: bool, keep: bool, n_threads: int,
                 timeout: float, endpoint: str | None = None) -> None:
        self.endpoint = endpoint         # its RPC server (backend:RPC), or None
        self.inflight: list[tuple[int, Case]] = []
        self.retired = False             # it said its state is spent, and went (not a death)
        self.current: int | None = None
        self.began = False               # it has started a case (past its imports)
        self.started = time.monotonic()
        self.last_words = ""             # the end of its stderr, once killed
        fd, self.stderr = tempfile.mkstemp(prefix="pyggml-parity-", suffix=".err")
        os.close(fd)
        try:
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=_worker_main, args=(child, paths, probe, keep, n_threads, self.stderr, timeout),
                                    daemon=True)
            try:
                with _worker_environment(n_threads, endpoint):
                    _start_ignoring_sigint(self.proc)
            finally:
                child.close()
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.stderr)
            raise

    def tail(self) -> str:
        try:
            with open(self.stderr, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 1500))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL without waiting (Ctrl-C: every worker at once, then :meth:`close`)."""
        with contextlib.suppress(Exception):
            if self.proc.is_alive():
                self.proc.kill()

    def close(self, kill=False):
        if kill:
            self.kill()
        try:
            if not kill:
                self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        if kill and os.path.exists(self.stderr):
            self.last_words = self.tail()        # read before the file goes
        with contextlib.suppress(OSError):
            os.unlink(self.stderr)


def _death(proc) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def run_cases(cases: list[Case], paths: Iterable[str] | None = None, workers: int = 0, probe: bool = True,
              keep: bool = False, timeout: float = 300.0, batch: int = 16,
              progress: Progress | None = None, n_threads: int = 1,
              rpc: list[str] | None = None) -> tuple[list[Row], dict[str, dict[str, list[np.ndarray]]]]:
    """Check every case; rows in the order of ``cases``. ``workers`` processes (0: in
    this process); a case that takes more than ``timeout`` seconds is a ``timeout`` row.
    With ``keep``, also {case key: {path: arrays}}. ``n_threads``: ggml's threads per
    computation. ``rpc``: RPC servers ("host:port") for the ``backend:RPC`` path, one per
    worker (a server serves one client at a time): at most that many workers run; in this
    process (``workers=0``), the first (the caller sets PYGGML_RPC_ENDPOINT).

    A worker that dies while computing a case makes that case a ``crashed`` row; one that
    dies between cases blames none, and its cases run again in a new worker. Ctrl-C
    stops the workers and raises :class:`Interrupted` (a KeyboardInterrupt) with the
    cases that finished."""
    paths = list(paths) if paths is not None else None
    if workers <= 0:
        results: list[Row] = []
        kept: dict[str, dict[str, list[np.ndarray]]] = {}
        done = 0
        try:
            for c in cases:
                rows, arrays = check_case(c, paths, probe, keep, n_threads)
                results.extend(rows)
                if arrays:
                    kept[c.key] = arrays
                done += 1
                if progress:
                    progress(done, len(cases), c)
        except KeyboardInterrupt as e:
            raise Interrupted(results, kept, done, len(cases)) from e
        return results, kept
    n = min(workers, max(1, len(cases)), len(rpc) if rpc else workers)
    with WorkerPool(n, paths, probe, keep, n_threads, timeout, batch, rpc) as pool:
        return pool.run(cases, progress)


class WorkerPool:
    """Worker processes that stay between :meth:`run` calls (:func:`run_cases` makes one
    for its cases; the pytest plugin keeps one for the session and hands it its items
    one at a time). A worker takes cases in batches of ``batch``; one that retires (its
    in-process proof found something) or dies is replaced. Arguments as for run_cases."""

    def __init__(self, workers: int, paths: list[str] | None = None, probe: bool = True, keep: bool = False,
                 n_threads: int = 1, timeout: float = 300.0, batch: int = 16, rpc: list[str] | None = None):
        self.size = max(1, min(workers, len(rpc) if rpc else workers))
        self.paths, self.probe, self.keep, self.n_threads = paths, probe, keep, n_threads
        self.timeout, self.batch, self.rpc = timeout, batch, rpc
        self.ctx = mp.get_context("spawn")   # a clean interpreter: no inherited threads or OpenMP state
        self.workers: list[_Worker] = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _new(self, endpoint: str | None) -> _Worker:
        return _Worker(self.ctx, self.paths, self.probe, self.keep, self.n_threads, self.timeout, endpoint)

    def close(self, kill: bool = False) -> None:
        if kill:
            for w in self.workers:           # all at once: no worker waits for the others' joins
                w.kill()
        for w in self.workers:
            w.close()
        self.workers = []

    def run(self, cases: list[Case],
            progress: Progress | None = None) -> tuple[list[Row], dict[str, dict[str, list[np.ndarray]]]]:
        """Check every case in the pool's workers: as :func:`run_cases`."""
        paths, probe, timeout = self.paths, self.probe, self.timeout
        results: dict[int, list[Row]] = {}
        kept: dict[str, dict[str, list[np.ndarray]]] = {}
        done = 0

        def finish(i: int, rows: list[Row], arrays: dict[str, Any] | None = None):
            nonlocal done
            results[i] = rows
            if arrays:
                kept[cases[i].key] = arrays
            done += 1
            if progress:
                progress(done, len(cases), cases[i])

        def finished() -> list[Row]:
            return [r for i in range(len(cases)) if i in results for r in results[i]]

        todo = list(enumerate(cases))
        todo.reverse()                       # popped from the end: in order
        pool = self.workers
        idle_deaths = 0
        with _SigintFlag() as sigint:
            try:
                def feed(w: _Worker):
                    chunk = [todo.pop() for _ in range(min(self.batch, len(todo)))]
                    w.inflight = chunk
                    w.current = None
                    if chunk:
                        w.started = time.monotonic()
                        try:
                            w.conn.send(chunk)
                        except OSError:      # it died already: its sentinel says so next round
                            pass

                for w in pool:
                    feed(w)
                while len(pool) < self.size and todo and not sigint.hit:
                    pool.append(self._new(self.rpc[len(pool)] if self.rpc else None))
                    feed(pool[-1])
                while not sigint.hit and any(w.inflight for w in pool):
                    busy = [w for w in pool if w.inflight]
                    ready = mp.connection.wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=0.25)
                    if sigint.hit:
                        break
                    now = time.monotonic()
                    for w in busy:
                        dead = w.proc.sentinel in ready and not w.conn.poll()
                        try:
                            while w.conn.poll():
                                msg = w.conn.recv()
                                if msg[0] == "start":
                                    w.current, w.started, w.began = msg[1], time.monotonic(), True
                                    idle_deaths = 0
                                elif msg[0] == "done":
                                    finish(msg[1], msg[2], msg[3])
                                    w.inflight = [(i, c) for i, c in w.inflight if i != msg[1]]
                                    w.current = None
                                    if not w.inflight and not w.retired:    # its next batch, when done with this one
                                        feed(w)
                                elif msg[0] == "retire":
                                    w.retired = True
                                    break
                        except (EOFError, OSError):
                            dead = True
                        if w.retired:                # replaced; the rest of its batch goes back, in order
                            todo.extend(reversed(w.inflight))
                            w.inflight = []
                            w.close()
                            pool[pool.index(w)] = nw = self._new(w.endpoint)
                            feed(nw)
                            continue
                        hung = w.current is not None and now - w.started > timeout
                        stuck = (w.current is None and w.inflight and not w.began
                                 and now - w.started > max(timeout, _WORKER_START_S))
                        if not (dead or hung or stuck):
                            continue
                        # the case it was computing (it said "start", not yet "done") is the
                        # culprit; with none (it died between cases, or before its first), no
                        # case is: the rest of the batch goes back, to be run in order
                        verdict = "timeout" if hung and not dead else "crashed"
                        w.close(kill=True)
                        if stuck and not dead:
                            detail = f"no case started after {max(timeout, _WORKER_START_S):.0f} s"
                        else:
                            detail = f"no result after {timeout:.0f} s" if verdict == "timeout" else _death(w.proc)
                        if w.last_words:
                            detail += f"; stderr: {w.last_words[-600:]}"
                        culprit = w.current
                        rest = [(i, c) for i, c in w.inflight if i != culprit]
                        todo.extend(reversed(rest))
                        if culprit is not None:
                            finish(culprit, _crash_rows(cases[culprit], paths, verdict, detail, probe))
                        w.inflight = []
                        if culprit is None and rest:
                            idle_deaths += 1
                            if idle_deaths >= _IDLE_DEATHS:
                                raise WorkerError(f"{idle_deaths} parity workers in a row died before running a case "
                                                  f"(last: {detail})", finished(), kept, len(results), len(cases))
                        pool[pool.index(w)] = nw = self._new(w.endpoint)
                        feed(nw)
            except BaseException:
                self.close(kill=True)
                raise
            finally:
                if sigint.hit:
                    for w in pool:           # what finished before Ctrl-C, still in the pipe, counts
                        with contextlib.suppress(EOFError, OSError):
                            while w.conn.poll():
                                msg = w.conn.recv()
                                if msg[0] == "done" and msg[1] not in results:
                                    finish(msg[1], msg[2], msg[3])
                    self.close(kill=True)
            if sigint.hit:
                raise Interrupted(finished(), kept, len(results), len(cases))
        return finished(), kept


def default_workers() -> int:
    """Worker processes: one per core this process may run on. With ``--threads N`` too
    (workers x N threads on the cores): their OpenMP threads wait passively
    (:func:`_worker_environment`), and one worker per core measured faster than
    ``cores // N`` workers (2 cores, --threads 2, full sweep without torch: 10.1 s with 2
    workers, 13.9 s with 1)."""
    from pyggml._machine import usable_cores
    return usable_cores()


def summarize(rows: list[Row]) -> dict[str, Any]:
    by = {v: 0 for v in ("ok", "fail", "refused", "oob", "crashed", "timeout", "error", "skipped")}
    for r in rows:
        by[r.verdict] = by.get(r.verdict, 0) + 1
    finite = [r.nmse for r in rows if r.nmse is not None and math.isfinite(r.nmse) and r.b == "reference"]
    return {"comparisons": len(rows), **by, "worst_nmse": max(finite, default=0.0),
            "subjects": len({r.subject for r in rows}), "cases": len({(r.subject, r.type, r.index) for r in rows})}
