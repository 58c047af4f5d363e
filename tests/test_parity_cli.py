"""``pyggml parity`` when things go wrong around the sweep: output paths checked before
any case runs, reports written atomically, Ctrl-C keeping what finished, and a worker
killed from outside blamed on the case it was running or on none."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from pyggml.__main__ import main as pyggml_main
from pyggml.parity import report, subjects
from pyggml.parity.model import Case, Outcome, Row, Subject

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

PY = sys.executable
PROGRESS = re.compile(r"^parity: \d+/\d+ cases \(\d+%\), \d+ s$")   # the non-tty progress line


# --- output paths are checked before the sweep ------------------------------------------

class Counted(Subject):
    """8 cases, each a quarter of a second on its ggml path; counts the computations."""
    name = op = "tests_cli_counted"
    paths = ("ggml", "reference")

    def __init__(self):
        self.calls = 0

    def cases(self, seed, quick):
        return [Case(self.name, "", i, seed, f"case {i}") for i in range(8)]

    def compute(self, case, path, n_threads=1):
        self.calls += 1
        if path == "ggml":
            time.sleep(0.25)
        return Outcome([np.full(3, float(case.index))])


@pytest.fixture
def counted():
    s = subjects.register_subject(Counted())
    yield s
    subjects._USER.pop(s.name, None)


def run_main(capsys, *args):
    t0 = time.perf_counter()
    rc = pyggml_main(["parity", "--op", "tests_cli_counted", "--workers", "0", *args])
    out, err = capsys.readouterr()
    return rc, out, err, time.perf_counter() - t0


def unwritable_dir(tmp_path):
    if os.geteuid() == 0:            # root writes anywhere a mode bit forbids: sysfs refuses new files
        return "/sys"
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return str(d)


def test_bad_output_paths_exit_2_before_any_case_runs(tmp_path, capsys, counted):
    # a good path: the sweep runs every case (2 paths each), which takes its time
    rc, out, err, sweep = run_main(capsys, "--json", str(tmp_path / "ok.json"))
    assert rc == 0 and counted.calls == 16 and (tmp_path / "ok.json").exists(), err
    assert sweep >= 2.0
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    bad = [("--json", str(tmp_path / "no" / "such" / "p.json"), "no such directory"),
           ("--html", str(tmp_path), "is a directory"),
           ("--save", os.path.join(unwritable_dir(tmp_path), "p.npz"), "cannot create a file"),
           ("--junit", str(a_file / "p.xml"), "is not a directory")]
    for option, path, why in bad:
        counted.calls = 0
        # the bad path last, after good ones: every output is checked, not only the first
        rc, out, err, took = run_main(capsys, "--json", str(tmp_path / "good.json"), option, path)
        assert rc == 2, (option, err)
        assert len(err.splitlines()) == 1 and err.startswith(f"pyggml parity: error: {option} {path}: "), err
        assert why in err and "Traceback" not in err and "usage:" not in err, err
        assert out == "" and counted.calls == 0, (option, out)
        assert took < sweep / 8, (option, took, sweep)
    left = set(os.listdir(tmp_path)) - {"ro"}
    assert left == {"a_file", "ok.json"}       # no good.json, no probe file left


# --- reports are written atomically -----------------------------------------------------

def rows(n=3, detail=""):
    return [Row(f"op:t{i % 5}", f"t{i % 5}", f"F32 #{i}", "F32", i, 0, "ggml", "reference", 1e-9 * i, 0.0, 1e-7,
                "ok", detail) for i in range(n)]


def test_a_full_disk_mid_write_keeps_the_previous_report_and_no_temp_file(tmp_path, monkeypatch, capsys, counted):
    path = tmp_path / "p.json"
    report.write_json(rows(), str(path), {"run": "before"})
    before = path.read_bytes()
    assert json.loads(before)["meta"] == {"run": "before"}
    real_dumps = json.dumps

    def dump_half_then_enospc(obj, f, **kw):
        text = real_dumps(obj, **kw)
        f.write(text[:len(text) // 2])
        f.flush()                      # the half is on disk, in the temp file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(json, "dump", dump_half_then_enospc)
    with pytest.raises(OSError) as e:
        report.write_json(rows(7), str(path), {"run": "after"})
    assert e.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.json"]
    # the command: one line, status 2, the previous report intact
    rc, out, err, _ = run_main(capsys, "--json", str(path))
    assert rc == 2 and counted.calls == 16
    assert err.splitlines()[-1] == f"pyggml parity: error: --json {path}: {os.strerror(errno.ENOSPC)}"
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.json"]


FSIZE = textwrap.dedent("""
    import errno, os, resource, sys
    import numpy as np
    from pyggml.parity import html, report, store
    from pyggml.parity.model import Row

    d = sys.argv[1]
    rows = [Row("op:t", "t", f"F32 #{i}", "F32", i, 0, "ggml", "reference", 1e-9, 0.0, 1e-7, "fail",
                "x" * 2000, "print(1)\\n" * 50) for i in range(100)]
    big = {"op:t|F32|0": {"ggml": [np.random.default_rng(0).standard_normal(100_000)]}}
    writers = {"p.json": lambda p: report.write_json(rows, p, {}), "p.xml": lambda p: report.write_junit(rows, p),
               "p.html": lambda p: html.write_html(rows, p, {}), "p.npz": lambda p: store.save(p, big, {})}
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))   # a write past 64 KiB fails: EFBIG
    for name, write in writers.items():
        try:
            write(os.path.join(d, name))
            print(name, "written")
        except OSError as e:
            print(name, errno.errorcode[e.errno])
""")


def test_every_writer_leaves_the_previous_file_when_the_disk_refuses_a_write(tmp_path):
    # a real short write (the file size limit), for the JSON, JUnit, HTML and .npz writers
    out = tmp_path / "out"
    out.mkdir()
    old = {}
    for name in ("p.json", "p.xml", "p.html", "p.npz"):
        old[name] = f"previous {name}\n".encode()
        (out / name).write_bytes(old[name])
    script = tmp_path / "fsize.py"
    script.write_text(FSIZE)
    proc = subprocess.run([PY, str(script), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(proc.stdout.split()) == sorted(["p.json", "EFBIG", "p.xml", "EFBIG", "p.html", "EFBIG",
                                                 "p.npz", "EFBIG"]), proc.stdout
    assert {n: (out / n).read_bytes() for n in old} == old
    assert sorted(os.listdir(out)) == sorted(old)


def test_atomic_writes_keep_the_mode_and_write_through_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("{}")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    report.write_json(rows(), str(link), {})
    assert link.is_symlink() and len(json.loads(target.read_text())["rows"]) == 3
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.json", "real.json"]


# --- Ctrl-C and workers killed from outside -----------------------------------------------

PLANTED = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from pyggml import parity
    from pyggml.parity import runner
    from pyggml.parity.model import Case, Outcome, Subject

    SLOW = int(os.environ.get("PLANTED_SLOW", "-1"))      # this case writes its pid to MARK and waits
    MARK = os.environ.get("PLANTED_MARK", "")
    DIE = os.environ.get("PLANTED_DIE", "")              # "between": the first worker dies after case 0;
    LOG = os.environ.get("PLANTED_LOG", "")              # "always": every worker before its first case;
                                                         # "stuck": every worker hangs before its first case
    runner._WORKER_START_S = float(os.environ.get("PLANTED_START", runner._WORKER_START_S))

    class Planted(Subject):
        name = op = "planted_cli"
        paths = ("ggml", "reference")

        def cases(self, seed, quick):
            return [Case(self.name, "", i, seed, f"case {i}") for i in range(8)]

        def compute(self, case, path, n_threads=1):
            if path == "ggml" and case.index == SLOW:
                print(f"planted: case {case.index} is taking its time", file=sys.stderr, flush=True)
                with open(MARK + ".part", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(MARK + ".part", MARK)
                time.sleep(60)
            return Outcome([np.full(4, float(case.index))])

    parity.register_subject(Planted())

    class DiesBeforeSecondStart:
        # killed from outside between two cases: after case 0 is done, before case 1 starts
        def __init__(self, conn):
            self.conn, self.starts = conn, 0

        def recv(self):
            return self.conn.recv()

        def send(self, msg):
            if msg[0] == "start":
                self.starts += 1
                if self.starts == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
            self.conn.send(msg)

    _real_worker_main = runner._worker_main

    def _worker_main(conn, *args):
        with open(LOG, "a") as f:
            f.write(f"{os.getpid()}\\n")
        if DIE == "always":
            os.kill(os.getpid(), signal.SIGKILL)
        if DIE == "stuck":
            time.sleep(600)
        if DIE == "between" and sum(1 for _ in open(LOG)) == 1:
            conn = DiesBeforeSecondStart(conn)
        _real_worker_main(conn, *args)

    if LOG:
        runner._worker_main = _worker_main

    if __name__ == "__main__":
        from pyggml.__main__ import main
        sys.exit(main(sys.argv[1:]))
""")


def planted(tmp_path, *args, **env):
    """Start ``pyggml parity --op planted_cli --workers 1 ARGS`` (the planted subject
    registered) in a session of its own; its temp files go to tmp_path/tmp."""
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    for d in ("out", "tmp", "mark"):
        (tmp_path / d).mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PLANTED_MARK": str(tmp_path / "mark" / "pid"),
           **{f"PLANTED_{k.upper()}": str(v) for k, v in env.items()}}
    # SIGINT at its default in the child, as in a terminal's foreground job: a test run that
    # was started in the background (`cmd &` in a script) inherits SIGINT ignored, and the
    # child, inheriting that, would rightly ignore the Ctrl-C the tests send
    return subprocess.Popen([PY, str(script), "parity", "--op", "planted_cli", "--workers", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                            start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_pid(tmp_path, proc, timeout=60):
    mark = tmp_path / "mark" / "pid"
    deadline = time.monotonic() + timeout
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the slow case never started"
        time.sleep(0.05)
    return int(mark.read_text())


def messages(stderr):
    return [ln for ln in stderr.splitlines() if not PROGRESS.match(ln)]


def by_case(doc):
    out = {}
    for r in doc["rows"]:
        out.setdefault(r["index"], set()).add(r["verdict"])
    return out


def test_ctrl_c_stops_the_workers_writes_what_finished_and_exits_130(tmp_path):
    out = tmp_path / "out"
    proc = planted(tmp_path, "--json", str(out / "p.json"), "--html", str(out / "p.html"),
                   "--junit", str(out / "p.xml"), slow=3)
    worker = wait_for_pid(tmp_path, proc)            # cases 0-2 done, case 3 running
    assert worker != proc.pid
    os.killpg(proc.pid, signal.SIGINT)               # as a terminal's Ctrl-C: the whole process group
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = messages(stderr)
    assert len(lines) == 1 and lines[0].startswith("pyggml parity: interrupted: 3 of 8 cases finished"), stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    doc = json.loads((out / "p.json").read_text())
    assert doc["partial"] is True and doc["meta"]["partial"] is True
    assert by_case(doc) == {0: {"ok"}, 1: {"ok"}, 2: {"ok"}}
    assert doc["summary"]["cases"] == 3
    assert 'id="partial"' in (out / "p.html").read_text()
    props = ET.parse(out / "p.xml").getroot().findall("properties/property")
    assert [(p.get("name"), p.get("value")) for p in props] == [("partial", "true")]
    assert "PARTIAL" in stdout
    # no temp file next to the reports, none of the workers' in TMPDIR; the worker is gone
    assert sorted(os.listdir(out)) == ["p.html", "p.json", "p.xml"]
    assert os.listdir(tmp_path / "tmp") == []
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


def test_a_worker_killed_while_computing_a_case_blames_that_case(tmp_path):
    out = tmp_path / "out"
    proc = planted(tmp_path, "--json", str(out / "p.json"), slow=5)
    os.kill(wait_for_pid(tmp_path, proc), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr               # a crashed row is a bad one
    doc = json.loads((out / "p.json").read_text())
    assert by_case(doc) == {**{i: {"ok"} for i in range(8) if i != 5}, 5: {"crashed"}}
    detail = next(r["detail"] for r in doc["rows"] if r["index"] == 5)
    assert "SIGKILL" in detail and "planted: case 5 is taking its time" in detail    # with the worker's stderr
    assert "partial" not in doc


def test_a_worker_killed_between_cases_blames_none(tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "workers.log"
    proc = planted(tmp_path, "--json", str(out / "p.json"), die="between", log=log)
    stdout, stderr = proc.communicate(timeout=120)
    # two workers: the first died after case 0, before case 1 started; its cases went to the second
    assert len(log.read_text().split()) == 2
    assert proc.returncode == 0, stderr
    assert by_case(json.loads((out / "p.json").read_text())) == {i: {"ok"} for i in range(8)}
    assert os.listdir(tmp_path / "tmp") == []


def test_workers_that_die_before_any_case_blame_none_and_end_the_sweep(tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "workers.log"
    proc = planted(tmp_path, "--json", str(out / "p.json"), die="always", log=log)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    lines = messages(stderr)
    assert len(lines) == 1 and "died before running a case" in lines[0] and "Traceback" not in stderr, stderr
    assert len(log.read_text().split()) == 3
    doc = json.loads((out / "p.json").read_text())
    assert doc["partial"] is True and doc["rows"] == []
    assert os.listdir(tmp_path / "tmp") == []


def test_workers_stuck_before_any_case_are_killed_and_end_the_sweep(tmp_path):
    """a worker that never starts a case (an import that hangs) is no hang of the sweep"""
    out = tmp_path / "out"
    log = tmp_path / "workers.log"
    t0 = time.monotonic()
    proc = planted(tmp_path, "--json", str(out / "p.json"), "--timeout", "1", die="stuck", log=log, start=1)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    lines = messages(stderr)
    assert len(lines) == 1 and "died before running a case" in lines[0], stderr
    assert "3 parity workers in a row died" in lines[0] and "no case started after 1 s" in lines[0]
    # three workers were started and killed; each wrote its pid if it got that far within its
    # second (a loaded machine may kill one while Python is still starting it: CI saw 2 lines)
    assert len(log.read_text().split()) <= 3 and time.monotonic() - t0 < 60
    assert json.loads((out / "p.json").read_text())["rows"] == []
    assert os.listdir(tmp_path / "tmp") == []


def test_the_rows_table_shows_whole_case_names():
    from pyggml.parity import report
    from pyggml.parity.model import Row
    long = "F32 contiguous (2, 3, 4, 5) mask (1, 1, 4, 5) F16 scale=0.25 max_bias=8.0 causal"
    rows = [Row("op:soft_max_ext", "soft_max_ext", long, "F32", 0, 0, "ggml", "reference", 1e-9, 1e-6, 1e-7, "ok"),
            Row("op:add", "add", "short", "F32", 0, 0, "ggml", "reference", 0.0, 0.0, 1e-7, "ok")]
    lines = report.format_rows(rows).splitlines()
    assert long in lines[1] and len(lines[1].split("ggml~reference")[0]) == len(lines[2].split("ggml~reference")[0])


# --- sharding a sweep over jobs, and joining the pieces ----------------------------------

SELECTION = ["--op", "add*", "--op", "rope*", "--quick", "--workers", "1"]


def _pyggml(*argv, cwd):
    return subprocess.run([PY, "-m", "pyggml", *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_shards_of_a_sweep_merge_into_the_unsharded_sweep_row_for_row(tmp_path):
    """N jobs with --shard 1/N .. N/N (here separate processes, as a CI matrix runs them)
    run every case once; pyggml parity merge of their --json reports gives the unsharded
    sweep's rows, every field equal, and its reports."""
    full = _pyggml("parity", *SELECTION, "--json", "full.json", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    counts = []
    for i in (1, 2, 3):
        proc = _pyggml("parity", *SELECTION, "--shard", f"{i}/3", "--json", f"s{i}.json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        counts.append(int(re.search(rf"shard {i}/3: (\d+) of the (\d+) cases", proc.stdout).group(1)))
    whole = json.loads((tmp_path / "full.json").read_text())
    n_cases = whole["summary"]["cases"]
    assert sum(counts) == n_cases and min(counts) > 0
    merged = _pyggml("parity", "merge", "s3.json", "s1.json", "s2.json", "--json", "m.json", "--junit", "m.xml",
                     "--html", "m.html", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr[-2000:]
    doc = json.loads((tmp_path / "m.json").read_text())
    key = lambda r: (r["subject"], r["type"], r["index"], r["a"], r["b"])  # noqa: E731
    assert doc["rows"] == sorted(whole["rows"], key=key)
    assert doc["summary"] == whole["summary"] and doc["meta"]["shards"] == 3
    assert doc["meta"]["total_cases"] == n_cases and not doc["meta"]["cpu_features_differ"]
    assert ET.parse(tmp_path / "m.xml").getroot().get("tests") == str(len(doc["rows"]))
    assert (tmp_path / "m.html").stat().st_size > 1000
    assert f"3 shards: {whole['summary']['subjects']} subjects, {n_cases} cases" in merged.stdout
    # pieces that are not the shards of one sweep
    (tmp_path / "other.json").write_text(json.dumps({**doc, "meta": {**json.loads(
        (tmp_path / "s2.json").read_text())["meta"], "seed": 7}, "rows": []}))
    for pieces, message in [(["s1.json", "s3.json"], "shards 2/3 missing"),
                            (["s1.json", "s1.json", "s2.json", "s3.json"], "shard 1/3 twice"),
                            (["s1.json", "other.json", "s3.json"], "are not one sweep: seed 7 against 0"),
                            (["full.json"], "not a shard"),
                            (["m.xml"], "not a report of pyggml parity --json")]:
        proc = _pyggml("parity", "merge", *pieces, cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, (pieces, proc.stderr)


def test_a_case_lands_in_the_same_shard_in_every_interpreter():
    """The shard is the case key's sha256, not Python's salted hash(): two interpreters with
    other hash seeds put every case in the same shard."""
    code = ("from pyggml.parity import runner; "
            "print([runner.shard_of(c, 5) for c in runner.select(['add*', 'rope*'], quick=True)])")
    outs = {subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd="/",
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    shards = json.loads(outs.pop())
    assert set(shards) == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("spec", ["0/3", "4/3", "1/0", "x/2", "2", "1/2/3"])
def test_a_bad_shard_is_refused_before_anything_runs(spec, capsys):
    with pytest.raises(SystemExit) as info:
        pyggml_main(["parity", "--op", "add", "--shard", spec])
    assert info.value.code == 2 and "--shard" in capsys.readouterr().err
