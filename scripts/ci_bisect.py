"""``scripts/ci_upstream.py --bisect``: git bisect over an upstream checkout, one build of
pyggml and one sweep of the op per revision, in a worktree of its own.

The revisions are checked out in a separate worktree of the checkout's repository
(``WORKDIR/bisect/worktree``, removed at the end, also on an error or Ctrl-C): the checkout
itself (its HEAD, branch, index and working tree) is never moved.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from ci_upstream import ROOT, Step, clean_env


def git(src: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", src, *args], capture_output=True, text=True, check=check)


def _remove_worktree(src: str, tree: Path) -> None:
    """Remove the worktree ``tree`` of ``src``'s repository (its directory and git's
    record of it, with its bisection state); also one that is locked, has changes, or
    whose directory is gone."""
    git(src, "worktree", "remove", "--force", "--force", str(tree), check=False)
    if tree.exists():                   # not a worktree of this repository, or git would not remove it
        shutil.rmtree(tree, ignore_errors=True)
        git(src, "worktree", "remove", "--force", "--force", str(tree), check=False)   # git's record of it


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def bisect_worktree(src: str, rev: str, workdir: Path) -> Iterator[Path]:
    """A worktree (``workdir/worktree``) of the checkout ``src``'s repository, detached at
    ``rev``, in which a bisection checks out its revisions: ``src`` itself (its HEAD,
    branch, index and working tree) is never moved. Removed on the way out, also on an
    error, Ctrl-C or SIGTERM."""
    tree = workdir / "worktree"
    _remove_worktree(src, tree)         # one a killed run left
    term = None
    if threading.current_thread() is threading.main_thread():
        term = signal.signal(signal.SIGTERM, _sigterm)      # then the finally below runs
    try:
        add = git(src, "worktree", "add", "--detach", str(tree), rev, check=False)
        if add.returncode:
            raise SystemExit(f"ci_upstream: --bisect: cannot check out {rev} of {src} in a worktree: "
                             f"{add.stderr.strip()}")
        yield tree
    finally:
        _remove_worktree(src, tree)
        if term is not None:
            signal.signal(signal.SIGTERM, term)


def bisect(src: str, good: str, bad: str, op: str, test_cmd: str | None, workdir: Path,
           bitwise: bool = False) -> tuple[str | None, str]:
    """Run ``git bisect`` over the checkout ``src``'s history between ``good`` and
    ``bad``, in a worktree of its own (bisect_worktree): the first commit at which the
    op's result changed (or ``test_cmd`` failed). Returns (commit or None, git bisect's
    log)."""
    workdir.mkdir(parents=True, exist_ok=True)
    # as the checkout names them: in the worktree, HEAD (HEAD~3, @{-1}...) is another commit
    good, bad = (_commit(src, rev) for rev in (good, bad))
    # src may be a subdirectory of its repository (ggml in llama.cpp): the same one of the worktree
    prefix = git(src, "rev-parse", "--show-prefix").stdout.strip()
    with bisect_worktree(src, good, workdir) as tree:
        return _bisect_in(str(tree), str(tree / prefix) if prefix else str(tree), good, bad, op, test_cmd,
                          workdir, bitwise)


def _commit(src: str, rev: str) -> str:
    """The commit ``rev`` names in the checkout ``src``."""
    proc = git(src, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if proc.returncode:
        raise SystemExit(f"ci_upstream: --bisect: {rev!r} is not a commit of {src}")
    return proc.stdout.strip()


def _bisect_in(top: str, src: str, good: str, bad: str, op: str, test_cmd: str | None, workdir: Path,
               bitwise: bool) -> tuple[str | None, str]:
    """bisect, in the worktree ``top`` (at ``good``, the bisection's to move), of the
    source tree ``src`` in it (``top`` or a subdirectory)."""
    if test_cmd:
        # run in src; a revision without that directory is skipped
        cmd = ["sh", "-c", test_cmd] if src == top else \
            ["sh", "-c", f"cd {shlex.quote(src)} 2>/dev/null || exit 125; exec sh -c {shlex.quote(test_cmd)}"]
    else:
        baseline = workdir / "good.npz"
        if _bisect_sweep(src, op, baseline, workdir) != 0:
            raise SystemExit(f"ci_upstream: --bisect: the good revision {good} does not build or sweep "
                             f"(see {workdir / 'log.txt'})")
        # (with --bitwise) outputs that are not the good revision's own to give: those that
        # change from one run of it to the next (a kernel reading memory it does not own)
        # and those of cases its sweep found reading or writing out of bounds. They would
        # make every revision look changed; the steps leave them out.
        again = workdir / "good-again.npz"
        if bitwise:
            _bisect_sweep(src, op, again, workdir)
        unstable = {f"{d['case']}|{d['path']}" for d in (_diff(workdir, baseline, again) or [])
                    if not d["bitwise"]} if again.exists() else set()
        doc = json.loads((workdir / "good-again.json").read_text()) if (workdir / "good-again.json").exists() else {}
        oob = {f"{r['subject']}|{r['type']}|{r['index']}" for r in doc.get("rows", [])
               if r.get("verdict") in ("oob", "crashed")}
        (workdir / "unstable.json").write_text(json.dumps(sorted(unstable), indent=1))
        (workdir / "oob-cases.json").write_text(json.dumps(sorted(oob), indent=1))
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "ci_upstream.py"), "--bisect-step", "--bisect-src", src, "--op", op,
               "--bisect-baseline", str(baseline), "--workdir", str(workdir)] + (["--bitwise"] if bitwise else [])
    # (git bisect runs from the top of a working tree)
    start = git(top, "bisect", "start", bad, good, check=False)
    if start.returncode:
        raise SystemExit(f"ci_upstream: --bisect: git bisect start {bad} {good} failed: {start.stderr.strip()}")
    proc = subprocess.run(["git", "-C", top, "bisect", "run", *cmd], capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    m = re.search(r"^([0-9a-f]{40}) is the first bad commit", log, re.M)
    return (m.group(1) if m else None), log


def _bisect_sweep(src: str, op: str, save: Path, workdir: Path) -> int:
    """Build pyggml against ``src`` as it is checked out (one environment and build
    directory for the whole bisection) and save the op's sweep; 125 if it does not build
    (git bisect skips the commit)."""
    venv = workdir / "venv"
    py = venv / "bin" / "python"
    step = Step(workdir / "log.txt") if not (workdir / "log.txt").exists() else Step.__new__(Step)
    step.log = workdir / "log.txt"
    if not py.exists() and step.run([sys.executable, "-m", "venv", venv]).returncode:
        return 125
    env = {**clean_env(), "PYGGML_GGML": "vendored", "PYGGML_GGML_SOURCE_DIR": src}
    if step.run([py, "-m", "pip", "install", "-C", f"build-dir={workdir / 'build'}", str(ROOT)], env=env).returncode:
        return 125
    run = step.run([py, "-m", "pyggml", "parity", "--op", op, "--save", save, "--json", save.with_suffix(".json"),
                    "--workers", "1"], env=env, cwd=workdir)
    return 0 if save.exists() else (125 if run.returncode else 1)


def bisect_step(src: str, op: str, baseline: Path, workdir: Path, bitwise: bool) -> int:
    """One revision of a bisection: 0 (good) when the op's outputs are wrong against the
    float64 reference exactly where the good revision's are (with ``bitwise``: when they
    have the good revision's bits), 1 (bad) otherwise, 125 (skip) when this revision does
    not build."""
    here = workdir / "step.npz"
    here.unlink(missing_ok=True)
    rc = _bisect_sweep(src, op, here, workdir)
    if rc:
        return rc
    if not bitwise:
        # judged by the reference: which of the op's outputs are wrong (beyond tolerance,
        # out of bounds, crashed) at this revision, against the good revision's. A kernel
        # reading memory it does not own gives other wrong numbers from build to build;
        # it stays wrong, so this holds still where a comparison of outputs would not.
        good_doc, here_doc = baseline.with_suffix(".json"), here.with_suffix(".json")
        if not (good_doc.exists() and here_doc.exists()):
            return 125
        return 0 if wrong_outputs(good_doc) == wrong_outputs(here_doc) else 1
    diffs = _diff(workdir, baseline, here)
    if diffs is None:
        return 125
    leave_out = set(json.loads((workdir / "unstable.json").read_text())) if (workdir / "unstable.json").exists() \
        else set()
    oob = set(json.loads((workdir / "oob-cases.json").read_text())) if (workdir / "oob-cases.json").exists() \
        else set()
    return 1 if changed_outputs(diffs, leave_out, oob, bitwise) else 0


def wrong_outputs(parity_json: Path) -> set[str]:
    """The outputs (case|path) a sweep found wrong against the float64 reference."""
    rows = json.loads(parity_json.read_text())["rows"]
    return {f"{r['subject']}|{r['type']}|{r['index']}|{r['a']}" for r in rows
            if r["b"] == "reference" and r["verdict"] not in ("ok", "skipped", "refused")}


def changed_outputs(diffs: list[dict], unstable: set[str], oob: set[str], bitwise: bool) -> list[dict]:
    """The rows of ``pyggml parity diff`` that count as a change at a bisection step:
    not bit-identical (with ``bitwise``) or beyond tolerance, leaving out the outputs
    the good revision itself gives unstably ("case|path") and its out-of-bounds cases."""
    return [d for d in diffs if f"{d['case']}|{d['path']}" not in unstable and d["case"] not in oob
            and not d["bitwise"] and (bitwise or d["beyond"])]


def _diff(workdir: Path, a: Path, b: Path) -> list[dict] | None:
    """``pyggml parity diff a b``'s rows (per case and path), or None when it failed."""
    out = workdir / "step-diff.json"
    out.unlink(missing_ok=True)
    subprocess.run([workdir / "venv" / "bin" / "python", "-m", "pyggml", "parity", "diff", str(a), str(b),
                    "--json", str(out)], capture_output=True, cwd=workdir)    # not where pyggml's sources are
    if not out.exists():
        return None
    return list(json.loads(out.read_text())["diffs"])
