"""scripts/ci_upstream.py: one work directory per distinct spec, and a bisection that never
moves the user's checkout (issue 17, item 14). Nothing here builds pyggml: the build steps
are stubbed."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sources import load_script, lock_source

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

ROOT = Path(__file__).resolve().parent.parent


ci = load_script("ci_upstream", "ci_upstream_under_test")
report = load_script("ci_report")
bis = load_script("ci_bisect")


# --- one work directory per distinct spec ----------------------------------------------


@pytest.fixture
def trees(tmp_path, monkeypatch):
    """Directories whose names slug alike ("x-y", "x_y", "x y" are all "x-y"), a link to
    one, and the cwd at their parent (for relative spellings)."""
    base = tmp_path / "trees"
    for name in ("x", "x-y", "x_y", "x y", "x+y"):
        (base / name).mkdir(parents=True)
    (base / "link-to-x").symlink_to(base / "x")
    monkeypatch.chdir(base)
    return base


def distinct_specs(t):
    """Specs of the documented grammar, pairwise distinct builds."""
    return [
        "vendored", "vendored+blas", "vendored+cuda", "vendored+blas+cuda", "vendored+vulkan", "vendored+metal",
        "vendored@generic", "vendored@sse42", "vendored@avx", "vendored@avx2", "vendored@avx512",
        "vendored+blas@avx2", "vendored+blas+cuda@avx2",
        "patched:vendored", "patched:vendored+blas", "patched:vendored@avx2",
        "pypi:libggml-python==0.17.0", "pypi:libggml-python==0.9.4", "pypi:libggml-python==0.9.40",
        f"src:{t / 'x'}", f"src:{t / 'x-y'}", f"src:{t / 'x_y'}", f"src:{t / 'x y'}", f"src:{t / 'x+y'}",
        f"src:{t / 'x'}+blas", f"src:{t / 'x'}@avx2", f"src:{t / 'x'}+blas@avx2",
        f"patched:src:{t / 'x'}", f"patched:src:{t / 'x-y'}", f"patched:src:{t / 'x'}+blas@avx",
        f"prefix:{t / 'x'}", f"prefix:{t / 'x-y'}", f"prefix:{t / 'x_y'}",
        *ci.DEFAULT_SPECS,
    ]


def equivalent_spellings(t):
    """Groups of spellings of one spec each."""
    return [
        ["vendored+blas+cuda", "vendored+cuda+blas", "vendored+blas+cuda+blas"],
        ["vendored+cuda+blas@avx2", "vendored+blas+cuda@avx2"],
        [f"src:{t / 'x'}", f"src:{t / 'x'}/", "src:x", "src:./x/", f"src:{t / 'x-y'}/../x", f"src:{t / 'link-to-x'}",
         f"src:{t / 'x'}//"],
        [f"src:{t / 'x'}+blas@avx2", "src:x+blas@avx2", f"src:{t / 'link-to-x'}/+blas@avx2"],
        [f"patched:src:{t / 'x'}", "patched:src:x/"],
        [f"prefix:{t / 'x y'}", "prefix:x y/"],
    ]


def test_distinct_specs_get_distinct_work_directories(trees):
    specs = list(dict.fromkeys(distinct_specs(trees)))          # DEFAULT_SPECS repeats some
    names = {s: ci.spec_dirname(s) for s in specs}
    canon = {s: ci.normalise_spec(s) for s in specs}
    assert len(set(canon.values())) == len(specs), "two distinct specs normalise alike"
    clash = {n: [s for s in specs if names[s] == n] for n in names.values()}
    assert {n: ss for n, ss in clash.items() if len(ss) > 1} == {}
    for s, n in names.items():
        # one safe, readable path component: the slug of the spec, then a sha256 prefix
        assert re.fullmatch(r"[A-Za-z0-9.-]+-[0-9a-f]{12}", n), n
        assert len(n) <= 64
    assert names["vendored"].startswith("vendored-") and names["vendored+blas"].startswith("vendored-blas-")
    assert names["pypi:libggml-python==0.17.0"].startswith("pypi-libggml-python-0.17.0-")


def test_spellings_of_one_spec_share_a_work_directory(trees):
    groups = equivalent_spellings(trees)
    seen = []
    for group in groups:
        names = {ci.spec_dirname(s) for s in group}
        assert len(names) == 1, (group, names)
        seen.append(names.pop())
    assert len(set(seen)) == len(groups)
    # the normalised spelling is itself a spelling of the spec
    for group in groups:
        canon = ci.normalise_spec(group[0])
        assert ci.normalise_spec(canon) == canon


def test_every_check_of_a_spec_is_made_when_it_is_normalised(trees):
    for bad in ("master", "vendored:x", "src:", "src:/no/such/dir", "prefix:/no/such/dir", "pypi:numpy==1.0",
                "pypi:libggml-python==", "pypi:libggml-python==0.17.0; rm -rf /", "vendored@mmx",
                "pypi:libggml-python==0.17.0@avx2", "pypi:libggml-python==0.17.0+blas", f"prefix:{trees / 'x'}+blas",
                f"prefix:{trees / 'x'}@avx2", "patched:pypi:libggml-python==0.17.0", "patched:patched:vendored",
                "patched:"):
        with pytest.raises(SystemExit):
            ci.normalise_spec(bad)
        with pytest.raises(SystemExit):
            ci.distinct_specs(["vendored", bad])


def _stub_steps(monkeypatch, calls):
    """Every command of run_spec succeeds without running (and builds nothing)."""
    def run(self, cmd, env=None, cwd=None, timeout=1800):
        calls.append([str(c) for c in cmd])
        with self.log.open("a") as f:
            f.write(f"$ {' '.join(map(str, cmd))}\n")
        return subprocess.CompletedProcess(cmd, 1, stdout="")      # the venv "fails": run_spec stops there
    monkeypatch.setattr(ci.Step, "run", run)


def test_a_spec_run_does_not_delete_another_specs_results(tmp_path, trees, monkeypatch):
    calls = []
    _stub_steps(monkeypatch, calls)
    work = tmp_path / "work"
    results = {}
    for spec in ("vendored", "vendored+blas", "vendored@avx2", "patched:vendored", f"src:{trees / 'x-y'}",
                 f"src:{trees / 'x_y'}"):
        row = ci.run_spec(spec, work, [])
        out = Path(row["log"]).parent
        assert out == work / ci.spec_dirname(spec)
        (out / "result").write_text(spec)
        results[spec] = out
    assert len(set(results.values())) == len(results)
    for spec, out in results.items():                   # none was removed by a later spec's run
        assert (out / "result").read_text() == spec
    # the same spec again: its own directory is replaced, the others are left
    ci.run_spec("vendored", work, [])
    assert not (results["vendored"] / "result").exists()
    assert (results["vendored+blas"] / "result").read_text() == "vendored+blas"


def test_diff_compares_two_sweeps_in_their_own_directories(tmp_path, monkeypatch):
    runs = []

    def fake_run(cmd, **kw):
        runs.append([str(c) for c in cmd])
        Path(cmd[cmd.index("--json") + 1]).write_text('{"per_op": {}}')
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")
    monkeypatch.setattr(subprocess, "run", fake_run)
    rows = []
    for spec in ("vendored", "vendored+blas"):
        d = tmp_path / ci.spec_dirname(spec)
        d.mkdir()
        (d / "parity.npz").write_bytes(b"x")
        rows.append({"spec": spec, "parity_npz": str(d / "parity.npz"), "python": sys.executable})
    rows.append({"spec": "vendored+blas+blas", "parity_npz": rows[1]["parity_npz"], "python": sys.executable})
    rows.append({"spec": "copy", "parity_npz": str(tmp_path / ci.spec_dirname("vendored") / "." / "parity.npz"),
                 "python": sys.executable})
    report.diff_specs(rows, tmp_path)
    assert len(runs) == 2
    for cmd in runs:
        a, b = cmd[cmd.index("diff") + 1: cmd.index("diff") + 3]
        assert a == rows[0]["parity_npz"] and b == rows[1]["parity_npz"] and a != b
        out = Path(cmd[cmd.index("--json") + 1])
        assert out.parent == Path(b).parent and ci.spec_dirname("vendored") in out.name
    assert rows[1]["diff"] == {"against": "vendored", "per_op": {}}
    assert "own sweep" in rows[3]["diff"]["error"]       # the base's own file: not diffed with itself


def test_main_runs_each_spec_once(trees, tmp_path, monkeypatch, capsys):
    ran = []

    def fake_run_spec(spec, workdir, pytest_args, quick_parity=False, reuse=None, results=None):
        ran.append(spec)
        return ci.empty_row(spec, workdir / ci.spec_dirname(spec) / "log.txt")
    monkeypatch.setattr(ci, "run_spec", fake_run_spec)
    argv = []
    for s in ("vendored", "src:x", f"src:{trees / 'x'}/", "vendored+blas", "vendored", f"src:{trees / 'x-y'}",
              "vendored+blas+blas"):
        argv += ["--ggml", s]
    assert ci.main([*argv, "--workdir", str(tmp_path / "w")]) == 1
    assert ran == ["vendored", "src:x", "vendored+blas", f"src:{trees / 'x-y'}"]
    assert "run once" in capsys.readouterr().out
    ran.clear()
    with pytest.raises(SystemExit):            # a bad spec stops the run before anything is built
        ci.main(["--ggml", "vendored", "--ggml", "pypi:libggml-python==0.17.0+blas", "--workdir",
                 str(tmp_path / "w")])
    assert ran == []


def test_pytest_args_are_split_as_a_shell_splits_them(tmp_path, monkeypatch):
    got = []

    def fake_run_spec(spec, workdir, pytest_args, quick_parity=False, reuse=None, results=None):
        got.append(pytest_args)
        return ci.empty_row(spec, workdir / ci.spec_dirname(spec) / "log.txt")
    monkeypatch.setattr(ci, "run_spec", fake_run_spec)
    ci.main(["--ggml", "vendored", "--workdir", str(tmp_path / "w"),
             "--pytest-args", "-n 2 -m 'not tooling' --durations=15"])
    # (.ci/run's: the marker expression is one argument, not "'not" and "tooling'")
    assert got == [["-n", "2", "-m", "not tooling", "--durations=15"]]


# --- a step that hangs: its whole process group killed, the matrix goes on -------------------


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by init) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_step_past_its_time_kills_its_whole_group_and_keeps_its_output(tmp_path):
    """A step whose command forks a child that spins (as a proof's child in a hung kernel
    does) and then hangs itself: after the timeout both are gone, what it printed before is
    in the log, and the step reads as exit 124, no exception."""
    import time
    pidfile = tmp_path / "grandchild.pid"
    script = (f"import os, subprocess, sys, time\n"
              f"c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
              f"print('before the hang', flush=True)\n"
              f"time.sleep(600)\n")
    step = ci.Step(tmp_path / "log.txt")
    t0 = time.monotonic()
    proc = step.run([sys.executable, "-c", script], timeout=3)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == ci.TIMED_OUT == 124
    assert "before the hang" in proc.stdout
    log = (tmp_path / "log.txt").read_text()
    assert "before the hang" in log and "[timed out after 3 s: its process group was killed]" in log
    assert log.rstrip().endswith("[exit 124]")
    took = re.search(r"\[(\d+\.\d) s\]\n\[exit 124\]$", log.rstrip())      # the step's time, as it ended
    assert took and 3 <= float(took.group(1)) < 30
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild), "the spinning child was left behind"


def test_a_step_keeps_its_output_and_status(tmp_path):
    step = ci.Step(tmp_path / "log.txt")
    proc = step.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert proc.returncode == 3 and "out" in proc.stdout and "err" in proc.stdout
    proc = step.run([sys.executable, "-c", "print('second')"])
    assert proc.returncode == 0 and proc.stdout.strip() == "second"     # only this step's output
    assert (tmp_path / "log.txt").read_text().count("[exit ") == 2


def test_a_spec_that_raises_is_a_failed_row_and_the_rest_still_run(tmp_path, monkeypatch, capsys):
    ran = []

    def fake_run_spec(spec, workdir, pytest_args, quick_parity=False, reuse=None, results=None):
        ran.append(spec)
        if spec == "vendored":
            raise RuntimeError("the build exploded")
        return ci.empty_row(spec, workdir / "log.txt")
    monkeypatch.setattr(ci, "run_spec", fake_run_spec)
    out = tmp_path / "m.json"
    assert ci.main(["--ggml", "vendored", "--ggml", "vendored+blas", "--workdir", str(tmp_path / "w"),
                    "--json", str(out)]) == 1
    assert ran == ["vendored", "vendored+blas"]
    import json
    rows = json.loads(out.read_text())["specs"]
    assert rows[0]["error"] == "RuntimeError: the build exploded" and not report.spec_ok(rows[0])
    assert "vendored: RuntimeError: the build exploded" in capsys.readouterr().out


# --- --reuse vendored=PYTHON: the CI's own install stands for the vendored spec -------------


def _check_answers(monkeypatch, answer):
    """reusable()'s probe of the interpreter answers ``answer`` (a dict; None: it fails)."""
    import json

    def run(self, cmd, env=None, cwd=None, timeout=1800):
        if answer is None:
            return subprocess.CompletedProcess(cmd, 1, stdout="")
        return subprocess.CompletedProcess(cmd, 0, stdout="noise\n" + json.dumps(answer) + "\n")
    monkeypatch.setattr(ci.Step, "run", run)


_lock_source = lock_source


GOOD = {"info": {"ggml_source": _lock_source(), "native": True}, "backends": ["CPU"], "stale": [], "editable": False}


@pytest.mark.parametrize("change, why", [
    ({}, ""),
    ({"editable": True}, "editable install"),
    ({"stale": ["ops.py"]}, "differs from this checkout in ops.py"),
    ({"backends": ["CPU", "BLAS"]}, "not the plain vendored build"),
    ({"info": {"ggml_source": "pypi:libggml-python==0.17.0", "native": True}}, "not the plain vendored build"),
    ({"info": {"ggml_source": _lock_source(), "native": False}}, "not the plain vendored build"),
])
def test_reuse_takes_only_the_plain_vendored_build_of_this_checkout(tmp_path, monkeypatch, change, why):
    _check_answers(monkeypatch, {**GOOD, **change})
    got = ci.reusable("vendored", Path(sys.executable), ci.Step(tmp_path / "log"), {})
    assert got == why if not why else why in got


def test_reuse_refuses_other_specs_and_a_broken_interpreter(tmp_path, monkeypatch):
    _check_answers(monkeypatch, GOOD)
    for spec in ("vendored+blas", "patched:vendored", "vendored@avx2", "pypi:libggml-python==0.17.0"):
        assert "only vendored" in ci.reusable(spec, Path(sys.executable), ci.Step(tmp_path / "log"), {})
    _check_answers(monkeypatch, None)
    assert "cannot import" in ci.reusable("vendored", Path(sys.executable), ci.Step(tmp_path / "log"), {})


def test_reuse_probe_reads_this_interpreter_truthfully(tmp_path):
    """The probe itself, run for real on the interpreter running the tests: an editable
    install is refused as one; an installed build is compared file by file."""
    import pyggml
    got = ci.reusable("vendored", Path(sys.executable), ci.Step(tmp_path / "log"), ci.clean_env())
    pkg = Path(pyggml.__file__).parent.resolve()
    if pkg == (ROOT / "pyggml").resolve():
        assert "editable install" in got
    elif pyggml.backends() and [d["name"] for d in pyggml.backends()] != ["CPU"]:
        assert "not the plain vendored build" in got
    else:
        # what the wheel ships: the build inputs (_gen_ops.py, ...) are not installed
        import fnmatch
        shipped = [p for p in (ROOT / "pyggml").glob("*.py")
                   if not any(fnmatch.fnmatch(f"pyggml/{p.name}", pat) for pat in ci.wheel_excludes())]
        assert "pyggml/_gen_ops.py" in ci.wheel_excludes() and shipped
        stale = [p.name for p in shipped if not (pkg / p.name).exists() or (pkg / p.name).read_bytes() != p.read_bytes()]
        info = pyggml.build_info()
        plain = info["ggml_source"] == _lock_source() and info["native"]
        if stale:
            assert "differs from this checkout" in got
        elif plain:
            assert got == ""                     # the README install, as .ci/run reuses it


def test_a_refused_reuse_builds_nothing_and_fails_the_spec(tmp_path, monkeypatch):
    _check_answers(monkeypatch, {**GOOD, "editable": True})
    row = ci.run_spec("vendored", tmp_path / "work", [], reuse=Path(sys.executable))
    assert not row["built"] and "editable" in row["reuse_refused"] and not report.spec_ok(row)
    assert not (tmp_path / "work" / ci.spec_dirname("vendored") / "venv").exists()
    assert "--reuse refused" in Path(row["log"]).read_text()


def test_main_checks_its_reuse_arguments(tmp_path, monkeypatch):
    seen = {}

    def fake_run_spec(spec, workdir, pytest_args, quick_parity=False, reuse=None, results=None):
        seen[spec] = reuse
        return ci.empty_row(spec, workdir / "log.txt")
    monkeypatch.setattr(ci, "run_spec", fake_run_spec)
    w = ["--workdir", str(tmp_path / "w")]
    for bad in (["--reuse", "vendored"], ["--reuse", "vendored="], ["--reuse", "vendored+blas=/usr/bin/python3"]):
        with pytest.raises(SystemExit):
            ci.main(["--ggml", "vendored", *bad, *w])
    assert seen == {}
    ci.main(["--ggml", "vendored", "--ggml", "vendored+blas", "--reuse", "vendored=py/bin/python", *w])
    assert seen == {"vendored": Path("py/bin/python").absolute(), "vendored+blas": None}


# --- --reuse-results DIR: the CI's README runs stand for the vendored spec's own -----------


BUILD = {"ggml_version": "0.20.2", "ggml_source": "pypi:x sha256:1", "native": True}


def _results(d, tests=10, failures=0, errors=0, skipped=2, summary=None, **meta):
    """A results directory as .ci/run leaves it: pytest's junit.xml, the sweep's JSON and
    saved outputs."""
    import json
    d.mkdir(parents=True, exist_ok=True)
    (d / "junit.xml").write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
        f'errors="{errors}" skipped="{skipped}"></testsuite></testsuites>')
    m = {"identity": dict(BUILD), "quick": False, "ops": [], "types": [], "paths": None, "threads": 1, **meta}
    m["identity"]["cpu_features"] = ["avx2"]
    summ = {"comparisons": 5, "ok": 5, "fail": 0, "worst_nmse": 1e-6, **(summary or {})}
    (d / "parity.json").write_text(json.dumps({"rows": [], "meta": m, "summary": summ}))
    (d / "parity.npz").write_bytes(b"npz")
    return d


def test_reused_results_give_the_row_of_the_runs_they_record(tmp_path):
    got, why = ci.reused_results(_results(tmp_path / "r"), False, BUILD)
    assert why == "" and got["tests_ok"] and got["parity_ok"]
    assert got["tests_summary"].startswith("8 passed, 2 skipped, 0 failed, 0 errors")
    got, why = ci.reused_results(_results(tmp_path / "f", failures=1), False, BUILD)
    assert why == "" and not got["tests_ok"] and got["parity_ok"]
    got, why = ci.reused_results(_results(tmp_path / "e", errors=1), False, BUILD)
    assert not got["tests_ok"]
    got, why = ci.reused_results(_results(tmp_path / "z", tests=0, skipped=0), False, BUILD)
    assert not got["tests_ok"]                          # no test ran: not a pass
    for bad in ("fail", "oob", "crashed", "timeout", "error"):
        got, why = ci.reused_results(_results(tmp_path / bad, summary={"ok": 3, bad: 1}), False, BUILD)
        assert why == "" and got["tests_ok"] and not got["parity_ok"], bad
    got, why = ci.reused_results(_results(tmp_path / "p", partial=True), False, BUILD)
    assert not got["parity_ok"]


@pytest.mark.parametrize("meta, quick, why", [
    ({"quick": True}, False, "not the sweep the matrix runs"),
    ({}, True, "not the sweep the matrix runs"),
    ({"ops": ["add"]}, False, "not the sweep the matrix runs"),
    ({"types": ["f16"]}, False, "not the sweep the matrix runs"),
    ({"threads": 2}, False, "not the sweep the matrix runs"),
    ({"identity": {**BUILD, "ggml_source": "pypi:y sha256:2"}}, False, "another build (ggml_source differ)"),
    ({"identity": {**BUILD, "native": False}}, False, "another build (native differ)"),
])
def test_reused_results_must_be_the_matrix_s_own_sweep_of_the_same_build(tmp_path, meta, quick, why):
    got, said = ci.reused_results(_results(tmp_path / "r", **meta), quick, BUILD)
    assert got == {} and why in said


def test_reused_results_refuse_a_missing_or_broken_file(tmp_path):
    d = _results(tmp_path / "r")
    (d / "parity.npz").unlink()
    assert "has no parity.npz" in ci.reused_results(d, False, BUILD)[1]
    d = _results(tmp_path / "s")
    (d / "junit.xml").write_text("<testsuites><testsuite")
    assert "unreadable (ParseError" in ci.reused_results(d, False, BUILD)[1]
    (d / "junit.xml").write_text("<testsuites/>")
    assert "has no testsuite" in ci.reused_results(d, False, BUILD)[1]


def test_run_spec_with_results_runs_neither_pytest_nor_the_sweep(tmp_path, monkeypatch):
    import json
    ran = []

    def run(self, cmd, env=None, cwd=None, timeout=1800):
        ran.append([str(c) for c in cmd])
        if "-c" in cmd and "build_info" in cmd[cmd.index("-c") + 1] and "backends" in cmd[cmd.index("-c") + 1]:
            return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({**BUILD, "backends": [{"name": "CPU"}]}))
        return subprocess.CompletedProcess(cmd, 1, stdout="")      # the ops probe fails: not needed here
    monkeypatch.setattr(ci.Step, "run", run)
    monkeypatch.setattr(ci, "reusable", lambda *a: "")
    res = _results(tmp_path / "r")
    row = ci.run_spec("vendored", tmp_path / "work", ["-n", "2"], reuse=Path(sys.executable), results=res)
    assert row["built"] and row["tests_ok"] and row["parity_ok"] and report.spec_ok(row), row
    assert not any("pytest" in c[0] or "parity" in c for c in ran), ran
    out = tmp_path / "work" / ci.spec_dirname("vendored")
    assert (out / "parity.npz").read_bytes() == b"npz" and row["parity_npz"] == str(out / "parity.npz")
    assert "tests and sweep reused" in Path(row["log"]).read_text()
    # results of another build: the spec fails, and says why
    bad = _results(tmp_path / "b", identity={**BUILD, "ggml_version": "0.17.0"})
    row = ci.run_spec("vendored", tmp_path / "work", [], reuse=Path(sys.executable), results=bad)
    assert not report.spec_ok(row) and "another build" in row["reuse_refused"]


def test_main_passes_results_only_to_the_reused_spec(tmp_path, monkeypatch):
    seen = {}

    def fake_run_spec(spec, workdir, pytest_args, quick_parity=False, reuse=None, results=None):
        seen[spec] = results
        return ci.empty_row(spec, workdir / "log.txt")
    monkeypatch.setattr(ci, "run_spec", fake_run_spec)
    w = ["--workdir", str(tmp_path / "w")]
    with pytest.raises(SystemExit):                 # results without the interpreter that made them
        ci.main(["--ggml", "vendored", "--reuse-results", "r", *w])
    assert seen == {}
    ci.main(["--ggml", "vendored", "--ggml", "vendored+blas", "--reuse", "vendored=py/bin/python",
             "--reuse-results", "r", *w])
    assert seen == {"vendored": Path("r").absolute(), "vendored+blas": None}


def test_upstream_tests_run_only_for_the_specs_named(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run_spec(spec, workdir, pytest_args, quick_parity=False, reuse=None, results=None,
                      upstream_tests=False):
        seen[spec] = upstream_tests
        row = ci.empty_row(spec, workdir / "log.txt")
        if upstream_tests:
            row["upstream_tests"] = {"upstream": {"test": {"cases": 3, "seconds": 1.0, "rc": 0, "ops": {
                "ADD": {"cases": 3, "supported": 3, "passed": 3, "failed": []}}}},
                "found": {"false_refusal": ["ADD: upstream runs 3/3 cases; pyggml refused all 2 of its sweep"]}}
        return row
    monkeypatch.setattr(ci, "run_spec", fake_run_spec)
    w = ["--workdir", str(tmp_path / "w")]
    with pytest.raises(SystemExit):                 # a spec the run does not have
        ci.main(["--ggml", "vendored", "--upstream-tests", "src:elsewhere", *w])
    assert seen == {}
    ci.main(["--ggml", "vendored", "--ggml", "vendored+blas", "--upstream-tests", "vendored", *w])
    assert seen == {"vendored": True, "vendored+blas": False}
    text = capsys.readouterr().out
    assert "upstream's test-backend-ops beside pyggml, vendored:" in text
    assert "test-backend-ops test -b CPU: 3 cases, 3 supported, 3 passed, 1 ops" in text
    assert "ADD: upstream runs 3/3 cases; pyggml refused all 2" in text


def test_the_html_grid_gets_a_column_of_upstreams_gradient_verdicts():
    grad = {"ADD": {"cases": 4, "supported": 4, "passed": 4, "failed": []},
            "SUM": {"cases": 7, "supported": 7, "passed": 6, "failed": ["permute=[1,0,2,3]"]},
            "GELU": {"cases": 12, "supported": 0, "passed": 0, "failed": []},
            "REGLU": {"cases": 17, "supported": 17, "passed": 17, "failed": [], "exit": -6, "abort": "ggml.c:1: x"}}
    rows = [{"spec": "vendored"}, {"spec": "sdist:x==1", "upstream_tests": {"upstream": {"grad": {"ops": grad}}}}]
    cols = report.upstream_columns(rows, ["add", "add_inplace", "sum", "gelu", "reglu", "mul"])
    assert cols == {"sdist:x==1: test-backend-ops grad": {"add": "ok", "add_inplace": "ok", "sum": "fail",
                                                          "gelu": "skipped", "reglu": "crashed"}}


def test_a_prebuilt_ggml_has_no_tree_for_upstreams_tests(tmp_path):
    row = {}
    ci.run_upstream_tests(row, "pypi", "libggml-python==0.17.0", tmp_path, Path(sys.executable),
                          ci.Step(tmp_path / "log"), ci.clean_env())
    assert row["upstream_tests"] == {"skipped": "no ggml source tree for a pypi spec"}
    assert "not run: no ggml source tree for a pypi spec" in report.upstream_tests_report([{"spec": "p", **row}])


def test_the_vendored_tree_s_upstream_tests_come_from_the_pin_s_sdist(tmp_path, monkeypatch):
    # vendor/ggml is the ggml folder of llama-cpp-python's sdist: test-backend-ops.cpp lies in
    # the enclosing llama.cpp/tests/ of that sdist, so backend_ops.py is told which one
    calls = []

    class FakeStep:
        def run(self, cmd, **kw):
            calls.append([str(c) for c in cmd])
            return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    if not (ROOT / "vendor" / "ggml" / "CMakeLists.txt").is_file():
        pytest.skip("vendor/ggml is not populated")
    row = {}
    ci.run_upstream_tests(row, "vendored", "", tmp_path, Path(sys.executable), FakeStep(), ci.clean_env())
    cmd = calls[-1]
    assert cmd[1].endswith("backend_ops.py") and cmd[cmd.index("--tree") + 1] == str(ROOT / "vendor" / "ggml")
    assert cmd[cmd.index("--sdist") + 1] == ci.pinned_lock()["package"] == "llama-cpp-python==0.3.36"


# --- bisect in a worktree ----------------------------------------------------------------


def git(repo, *args, check=True):
    return subprocess.run(["git", "-C", str(repo), *args], check=check, capture_output=True, text=True)


@pytest.fixture
def upstream(tmp_path):
    """A repository whose 7 commits on branch ``main`` hold result.txt (1 1 1 2 2 2 2:
    commit 3 changes it), in both the top directory and ggml/ (a source tree in a
    subdirectory, as ggml in llama.cpp); the checkout has a staged change, an unstaged one
    and an untracked file."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "ci@example.invalid")
    git(repo, "config", "user.name", "ci")
    shas = []
    (repo / "ggml").mkdir()
    for i, value in enumerate([1, 1, 1, 2, 2, 2, 2]):
        for d in (repo, repo / "ggml"):
            (d / "result.txt").write_text(f"{value}\n")
        (repo / "n.txt").write_text(f"{i}\n")
        (repo / "staged.txt").write_text(f"{i}\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD").stdout.strip())
    (repo / "n.txt").write_text("uncommitted\n")
    (repo / "staged.txt").write_text("staged\n")
    git(repo, "add", "staged.txt")
    (repo / "untracked.txt").write_text("mine\n")
    return repo, shas


def checkout_state(repo):
    """What the user's checkout is: its HEAD (branch and commit), index and working tree,
    its worktrees, refs and bisection state."""
    return {
        "branch": git(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout.strip(),
        "head": git(repo, "rev-parse", "HEAD").stdout.strip(),
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all").stdout,
        "staged": git(repo, "diff", "--cached").stdout,
        "unstaged": git(repo, "diff").stdout,
        "files": sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts),
        "worktrees": git(repo, "worktree", "list", "--porcelain").stdout,
        "refs": git(repo, "for-each-ref").stdout,
        "bisecting": git(repo, "bisect", "log", check=False).returncode == 0,
    }


def assert_untouched(repo, before, workdir):
    after = checkout_state(repo)
    assert after == before
    assert after["branch"] == "refs/heads/main" and not after["bisecting"]
    assert len([ln for ln in after["worktrees"].splitlines() if ln.startswith("worktree ")]) == 1
    assert not (workdir / "worktree").exists()
    assert not list((repo / ".git").glob("worktrees/*"))
    assert "refs/bisect" not in git(repo, "for-each-ref").stdout


@pytest.mark.parametrize("sub", ["", "ggml"])
def test_bisect_runs_in_a_worktree_and_leaves_the_checkout_alone(upstream, tmp_path, sub):
    repo, shas = upstream
    src = repo / sub if sub else repo
    before = checkout_state(repo)
    seen = tmp_path / "seen.txt"
    # at each revision: judge it, and note where it ran and what the user's checkout was then
    # (git bisect run sets GIT_DIR to the worktree's for the command)
    g = f'env -u GIT_DIR -u GIT_WORK_TREE -u GIT_PREFIX git -C "{repo}"'
    test = (f'r=$(cat result.txt); (pwd -P; {g} symbolic-ref HEAD; {g} rev-parse HEAD; '
            f'{g} status --porcelain=v1 --untracked-files=all | md5sum) >> "{seen}"; test "$r" = 1')
    work = tmp_path / "work"
    commit, log = bis.bisect(str(src), "HEAD~6", "main", "", test, work)
    assert commit == shas[3], log
    assert_untouched(repo, before, work)
    lines = seen.read_text().splitlines()
    assert len(lines) >= 8 and len(lines) % 4 == 0
    status_sum = subprocess.run(["md5sum"], input=before["status"], capture_output=True, text=True).stdout
    for i in range(0, len(lines), 4):
        where, branch, head, status = lines[i:i + 4]
        assert where == str((work / "worktree" / sub).resolve()).rstrip("/")   # not the checkout
        assert (branch, head) == ("refs/heads/main", shas[-1])                 # never moved, even meanwhile
        assert status == status_sum.strip()


def test_a_bisect_test_that_aborts_leaves_the_checkout_alone(upstream, tmp_path):
    repo, shas = upstream
    before = checkout_state(repo)
    commit, log = bis.bisect(str(repo), shas[0], shas[-1], "", "exit 200", tmp_path / "work")  # >127: git aborts
    assert commit is None
    assert_untouched(repo, before, tmp_path / "work")


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_a_failing_build_step_leaves_the_checkout_alone(upstream, tmp_path, monkeypatch, exc):
    """The build of the good revision (stubbed) raises: the worktree is removed, the
    checkout is where it was."""
    repo, shas = upstream
    before = checkout_state(repo)
    calls = []

    def sweep(src, op, save, workdir):
        calls.append((src, git(src, "rev-parse", "HEAD").stdout.strip(), checkout_state(repo)))
        raise exc("the build failed")
    monkeypatch.setattr(bis, "_bisect_sweep", sweep)
    work = tmp_path / "work"
    with pytest.raises(exc):
        bis.bisect(str(repo), shas[1], shas[-1], "op:x", None, work)
    assert len(calls) == 1
    src, head, state = calls[0]
    assert Path(src) == work / "worktree" and head == shas[1]       # built in the worktree, at the good revision
    assert (state["branch"], state["head"], state["status"]) == (before["branch"], before["head"], before["status"])
    assert_untouched(repo, before, work)


def test_ctrl_c_during_the_bisection_leaves_the_checkout_alone(upstream, tmp_path, monkeypatch):
    """git bisect has started (and moved the worktree) when Ctrl-C comes."""
    repo, shas = upstream
    before = checkout_state(repo)
    real_run = subprocess.run
    moved = []

    def run(cmd, *a, **kw):
        if cmd[:1] == ["git"] and cmd[3:5] == ["bisect", "run"]:
            moved.append(real_run(["git", "-C", cmd[2], "rev-parse", "HEAD"], capture_output=True,
                                  text=True).stdout.strip())
            raise KeyboardInterrupt
        return real_run(cmd, *a, **kw)
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(KeyboardInterrupt):
        bis.bisect(str(repo), shas[0], shas[-1], "", "true", tmp_path / "work")
    assert moved and moved[0] not in (shas[0], shas[-1])                  # bisect had checked out a midpoint
    monkeypatch.setattr(subprocess, "run", real_run)
    assert_untouched(repo, before, tmp_path / "work")


def test_the_bisection_steps_build_the_worktree(upstream, tmp_path, monkeypatch):
    """With the builds stubbed: the good revision's sweep and the per-revision command
    (--bisect-step) are pointed at the worktree, not the checkout."""
    repo, shas = upstream
    before = checkout_state(repo)
    sweeps = []

    def sweep(src, op, save, workdir):
        sweeps.append((src, git(src, "rev-parse", "HEAD").stdout.strip()))
        save.write_bytes(b"npz")
        return 0
    monkeypatch.setattr(bis, "_bisect_sweep", sweep)
    real_run = subprocess.run
    steps = []

    def run(cmd, *a, **kw):
        if cmd[:1] == ["git"] and cmd[3:5] == ["bisect", "run"]:
            steps.append(cmd)
            return subprocess.CompletedProcess(cmd, 0, stdout=f"{shas[3]} is the first bad commit\n", stderr="")
        return real_run(cmd, *a, **kw)
    monkeypatch.setattr(subprocess, "run", run)
    work = tmp_path / "work"
    commit, _ = bis.bisect(str(repo / "ggml"), shas[0], shas[-1], "op:x", None, work)
    monkeypatch.setattr(subprocess, "run", real_run)
    assert commit == shas[3]
    assert sweeps == [(str(work / "worktree" / "ggml"), shas[0])]
    cmd = steps[0]
    assert cmd[2] == str(work / "worktree")                 # git bisect runs from the top of the worktree
    assert cmd[cmd.index("--bisect-src") + 1] == str(work / "worktree" / "ggml")
    assert_untouched(repo, before, work)


def test_a_worktree_left_by_a_killed_run_is_replaced(upstream, tmp_path):
    repo, shas = upstream
    work = tmp_path / "work"
    work.mkdir()
    git(repo, "worktree", "add", "-q", "--detach", str(work / "worktree"), shas[2])
    (work / "worktree" / "junk.txt").write_text("left")
    before = checkout_state(repo)
    commit, log = bis.bisect(str(repo), shas[0], shas[-1], "", 'test "$(cat result.txt)" = 1', work)
    assert commit == shas[3], log
    after = checkout_state(repo)
    assert after["worktrees"].count("worktree ") == 1
    assert {k: v for k, v in after.items() if k != "worktrees"} == {k: v for k, v in before.items()
                                                                  if k != "worktrees"}
    assert not (work / "worktree").exists()


def test_a_revision_the_checkout_does_not_have_is_refused(upstream, tmp_path):
    repo, shas = upstream
    before = checkout_state(repo)
    with pytest.raises(SystemExit, match="not a commit"):
        bis.bisect(str(repo), "no-such-rev", shas[-1], "", "true", tmp_path / "work")
    assert_untouched(repo, before, tmp_path / "work")


def test_sigterm_during_the_bisection_leaves_the_checkout_alone(upstream, tmp_path):
    """The script killed (SIGTERM, as a CI job's cancel) while a revision is tested."""
    import signal
    import time
    repo, shas = upstream
    before = checkout_state(repo)
    started = tmp_path / "started"
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "ci_upstream.py"), "--bisect", f"src:{repo}",
                             "--good", shas[0], "--bad", shas[-1], "--bisect-test", f'touch "{started}"; sleep 60',
                             "--workdir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=5)[0]
        assert (work / "bisect" / "worktree").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_untouched(repo, before, work / "bisect")


def test_the_specs_prove_under_a_short_time_limit_unless_the_caller_sets_one(monkeypatch):
    """A kernel that spins on some release costs each proving test PROOF_LIMIT_S, not the
    600 s a plain import allows; the caller's own limit is kept."""
    monkeypatch.delenv("PYGGML_PROOF_LIMIT", raising=False)
    assert ci.clean_env()["PYGGML_PROOF_LIMIT"] == str(ci.PROOF_LIMIT_S)
    assert 0 < ci.PROOF_LIMIT_S < 600
    monkeypatch.setenv("PYGGML_PROOF_LIMIT", "5")
    assert ci.clean_env()["PYGGML_PROOF_LIMIT"] == "5"


def test_every_known_failure_names_a_test_that_exists():
    """tests/expectations.py: a key that names no test would never apply (and never be
    seen to go stale)."""
    from expectations import KNOWN_FAILURES
    for version, known in KNOWN_FAILURES.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        for key, why in known.items():
            path, _, name = key.partition("::")
            assert path.startswith("tests/") and (ROOT / path).is_file(), key
            assert re.search(rf"^def {re.escape(name.split('[')[0])}\(", (ROOT / path).read_text(), re.M), key
            assert why.strip(), key


def test_a_known_failure_names_a_test_with_or_without_its_parameters(monkeypatch):
    import expectations
    monkeypatch.setattr(expectations, "KNOWN_FAILURES", {
        "9.9.9": {"tests/test_x.py::test_all": "every parameter", "tests/test_x.py::test_one[b]": "one"}})
    assert expectations.known_failure("tests/test_x.py::test_all[a-1]", "9.9.9") == "every parameter"
    assert expectations.known_failure("tests/test_x.py::test_all", "9.9.9") == "every parameter"
    assert expectations.known_failure("tests/test_x.py::test_one[b]", "9.9.9") == "one"
    assert expectations.known_failure("tests/test_x.py::test_one[c]", "9.9.9") is None
    assert expectations.known_failure("tests/test_x.py::test_all[a-1]", "0.20.2") is None


def test_a_sweep_s_bad_rows_are_known_where_the_release_s_tests_record_them():
    # a sweep row is the case of test_op_matches_reference[op-type-index] (the same seeds):
    # known exactly where tests/expectations.py records that test for the release
    def row(subject, op, type_, index, verdict):
        return {"subject": subject, "op": op, "type": type_, "index": index, "verdict": verdict}
    rows = [row("op:top_k", "top_k", "F32", 3, "fail"),              # 0.9.4: top_k-* recorded
            row("op:concat", "concat", "Q8_0", 1, "oob"),            # 0.9.4: concat-Q8_0-1 recorded
            row("op:concat", "concat", "Q8_0", 7, "oob"),            # not recorded
            row("grad:exp", "exp", "F32", 0, "fail"),                # gradients: never known
            row("op:add", "add", "F32", 0, "ok"), row("op:add", "add", "F32", 1, "skipped")]
    assert report.known_sweep_findings(rows, "0.9.4") == (4, 2)
    assert report.known_sweep_findings(rows, "0.25.3") == (4, 0)
    assert report.known_sweep_findings(rows, None) == (4, 0)
    assert report.known_sweep_findings(rows[4:], "0.9.4") == (0, 0)
    # the matrix table says how many of a spec's bad rows are recorded findings
    base = {"spec": "pypi:libggml-python==0.9.4", "ggml_version": "0.9.4", "built": True, "tests_ok": True,
            "worst_nmse": 1.0, "seconds": 1.0, "known_defects": []}
    text = report.table([{**base, "parity_ok": True, "parity": {"known_findings": 61}}])
    assert "pypi:libggml-python==0.9.4: 61 of its sweep's bad rows are findings recorded for ggml 0.9.4" in text
    text = report.table([{**base, "parity_ok": False, "parity": {"known_findings": 2}}])
    assert "recorded for ggml 0.9.4 (tests/expectations.py); the others are not" in text


def test_the_skips_where_a_release_refuses_a_sample_are_counted():
    out = "\n".join([
        "SKIPPED [3] tests/conftest.py:78: ggml 0.9.4 aborts on this sample (caught; its rules and kernels are "
        "not pyggml's): abs: ggml would abort: ggml.c:5476: GGML_ASSERT(ggml_is_contiguous_1(a)) failed",
        "SKIPPED [1] ../work/main/tests/conftest.py:78: ggml 0.9.4 lacks what this sample needs: xielu: not there",
        "SKIPPED [2] tests/test_backend_multi.py:45: a build without PYGGML_BLAS=ON",
        "SKIPPED [5] tests/conftest.py:78: something else",
        "6691 passed, 1178 skipped, 53 xfailed in 166.90s"])
    assert report.release_refusals(out) == 4
    assert report.release_refusals("8558 passed, 18 skipped") == 0
    row = {"spec": "pypi:libggml-python==0.9.4", "ggml_version": "0.9.4", "built": True, "tests_ok": True,
           "parity_ok": True, "worst_nmse": None, "seconds": 1.0, "known_defects": [], "release_refusals": 4,
           "tests_summary": "6691 passed, 1178 skipped, 53 xfailed"}
    assert ("pypi:libggml-python==0.9.4: 4 tests skipped where ggml 0.9.4 refuses the sample itself "
            "(6691 passed, 1178 skipped, 53 xfailed)") in report.table([row])


# --- the matrix as parallel CI jobs -------------------------------------------------------

WORKFLOW = ROOT / ".github" / "workflows" / "parity-matrix.yml"


def test_the_job_matrices_are_the_specs_and_the_shards():
    specs = ci.job_matrix("specs", ci.distinct_specs(list(ci.DEFAULT_SPECS)), ["vendored"], 4)["include"]
    assert [j["spec"] for j in specs] == list(ci.DEFAULT_SPECS)
    names = [j["name"] for j in specs]           # artefact names: no ':', '=', '@', '/'
    assert len(set(names)) == len(names) and all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names)
    assert [j["spec"] for j in specs if j["upstream_tests"]] == ["vendored"]
    assert ci.job_matrix("shards", [], [], 3) == {"shard": [1, 2, 3], "of": [3]}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ci_upstream.py"), "--emit-matrix", "shards",
                          "--shards", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == '{"shard": [1, 2], "of": [2]}'


def test_the_workflow_validates_and_plans_with_the_script():
    """.github/workflows/parity-matrix.yml against GitHub's workflow schema (check-jsonschema's
    vendored copy: no network), and its plan step asks the script for both matrices."""
    text = WORKFLOW.read_text()
    assert "scripts/ci_upstream.py --emit-matrix specs" in text and "--emit-matrix shards" in text
    assert "pyggml parity --shard '${{ matrix.shard }}/${{ matrix.of }}'" in text
    assert "pyggml parity merge pieces/shard-*.json" in text and "ci_upstream.py --merge pieces/spec-*.json" in text
    pytest.importorskip("check_jsonschema")
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_merge_joins_the_jobs_matrices(tmp_path):
    """ci_upstream.py --merge: the specs of several jobs' --json matrices in one report (a
    failed spec fails it); a spec in two reports is refused."""
    import json
    for i, spec in enumerate(("vendored", "pypi:libggml-python==0.9.4")):
        row = ci.empty_row(spec, tmp_path / f"log{i}.txt")
        (tmp_path / f"m{i}.json").write_text(json.dumps({"specs": [row], "timeline": []}))
    script = str(ROOT / "scripts" / "ci_upstream.py")
    proc = subprocess.run([sys.executable, script, "--merge", str(tmp_path / "m0.json"), str(tmp_path / "m1.json"),
                           "--json", str(tmp_path / "all.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr          # nothing was built: both specs failed
    assert "FAILED: vendored, pypi:libggml-python==0.9.4" in proc.stdout
    assert [r["spec"] for r in json.loads((tmp_path / "all.json").read_text())["specs"]] == \
        ["vendored", "pypi:libggml-python==0.9.4"]
    proc = subprocess.run([sys.executable, script, "--merge", str(tmp_path / "m0.json"), str(tmp_path / "m0.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "vendored in more than one report" in proc.stderr
