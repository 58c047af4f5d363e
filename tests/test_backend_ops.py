"""scripts/backend_ops.py: upstream's test-backend-ops beside pyggml's sweep (issue 24,
item 4). The reading of its output and the comparison are checked on made-up output;
the build and the run on a tiny stand-in ggml tree (a ``ggml`` library and a program
that prints what test-backend-ops prints), compiled with the machine's CMake."""

import json
import re
import shutil
import textwrap
import time
from pathlib import Path

import pytest
from sources import load_script

ROOT = Path(__file__).resolve().parent.parent


bo = load_script("backend_ops", "backend_ops_under_test")

FIELDS = ("test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, "
          "time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name")


def insert(op, params, supported, passed, mode="test"):
    values = ["2026-12-03", "abc", "CPU", op, params, mode, "1" if supported else "0", "1" if passed else "0", "",
              "0", "0", "0", "0", "0", "cpu", "CPU"]
    quoted = ", ".join("'" + v + "'" for v in values)
    return f"INSERT INTO test_backend_ops ({FIELDS}) VALUES ({quoted});"


def test_the_sql_output_is_read_row_by_row():
    text = "\n".join([
        "CREATE TABLE IF NOT EXISTS test_backend_ops (", "  op_name TEXT", ");",
        "Testing 1 devices",
        insert("ADD", "type=f32,ne=[10,5,4,3]", True, True),
        insert("ADD", "type=f16,ne=[10,5,4,3]", True, False),
        insert("GELU", "type=bf16,ne=[128,2,2,2]", False, False),
        "INSERT INTO test_backend_ops (a, b) VALUES ('1');",            # fields and values disagree: skipped
    ])
    rows = bo.parse_sql(text)
    assert [(r["op_name"], r["op_params"], r["supported"], r["passed"]) for r in rows] == [
        ("ADD", "type=f32,ne=[10,5,4,3]", "1", "1"), ("ADD", "type=f16,ne=[10,5,4,3]", "1", "0"),
        ("GELU", "type=bf16,ne=[128,2,2,2]", "0", "0")]
    s = bo.summarize(rows)
    assert s == {"ADD": {"cases": 2, "supported": 2, "passed": 1, "failed": ["type=f16,ne=[10,5,4,3]"]},
                 "GELU": {"cases": 1, "supported": 0, "passed": 0, "failed": []}}


# grad mode's console lines as ggml 0.25.3's test-backend-ops prints them (2026-12-03)
GRAD_CONSOLE = """\
Testing 1 devices

Backend 1/1: CPU
  ADD(type=f16,ne=[1,1,8,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0): not supported [out->type != FP32]
  ADD(type=f32,ne=[1,1,8,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0): \x1b[1;32mOK\x1b[0m
  SUM(type=f32,ne=[1,1,8,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0): \x1b[1;32mOK\x1b[0m
  ADD(type=f32,ne=[1,1,320,320],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0): \x1b[1;32mOK\x1b[0m
  ADD(type=f32,ne=[1,1,320,320],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0): skipping large tensors for speed 
  SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3]): \x1b[1;32mOK\x1b[0m
  SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3]): [SUM] MAA = 0.996977786 > 0.000100000 \x1b[1;31mFAIL\x1b[0m
  SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3]): compare failed \x1b[1;31mFAIL\x1b[0m
  20766/20766 tests passed
"""


def test_the_console_output_is_read_case_by_case():
    rows = bo.parse_console(GRAD_CONSOLE)
    assert [(r["op_name"], r["supported"], r["passed"]) for r in rows] == [
        ("ADD", "0", "0"),          # not supported
        ("ADD", "1", "1"),          # "OK" before it ran, then the SUM node it checked: OK
        ("ADD", "0", "0"),          # skipped (its early "OK" is not its verdict)
        ("SUM", "1", "0")]          # MAA past the bound
    assert rows[3]["error_message"] == "compare failed FAIL"
    assert bo.summarize(rows)["SUM"]["failed"] == ["type=f32,ne=[33,256,1,1],permute=[1,0,2,3]"]


def test_a_quote_in_a_value_is_read_back():
    line = insert("X", "it''s", True, True)          # SQL doubles a quote
    assert bo.parse_sql(line)[0]["op_params"] == "it's"


def test_op_names_follow_ggml_op_desc():
    assert bo.op_names("ADD") == "ADD"
    assert bo.op_names("UNARY:GELU") == "GELU"
    assert bo.op_names("GLU:SWIGLU") == "SWIGLU"
    assert bo.op_names("UNARY:*") is None
    makes = bo.makes_by_function()
    assert makes["add"] == makes["add_inplace"] == "ADD"
    assert makes["gelu"] == "GELU" and makes["swiglu"] == "SWIGLU" and makes["mul_mat"] == "MUL_MAT"
    assert "unary" not in makes


def _row(op, verdict, a="ggml"):
    return {"op": op, "verdict": verdict, "a": a}


def test_the_comparison_names_each_kind_of_disagreement():
    upstream = {
        "test": {"ops": {
            "GELU": {"cases": 10, "supported": 10, "passed": 10, "failed": []},      # pyggml refuses all
            "ADD": {"cases": 4, "supported": 4, "passed": 4, "failed": []},          # pyggml finds it wrong
            "MUL": {"cases": 3, "supported": 3, "passed": 2, "failed": ["type=f16"]},   # upstream fails
            "SUB": {"cases": 3, "supported": 3, "passed": 3, "failed": []},          # both fine
        }},
        "grad": {"ops": {
            "MUL": {"cases": 2, "supported": 2, "passed": 2, "failed": []},          # pyggml's gradient wrong
            "SUB": {"cases": 2, "supported": 2, "passed": 1, "failed": ["ne=[2]"]},  # upstream's gradient wrong
        }},
    }
    makes = {"gelu": "GELU", "add": "ADD", "mul": "MUL", "sub": "SUB"}
    rows = ([_row("gelu", "refused")] * 3 + [_row("add", "ok"), _row("add", "fail")] + [_row("mul", "ok")]
            + [_row("mul", "fail", a="autodiff")] + [_row("sub", "ok")] * 2 + [_row("sub", "ok", a="autodiff")])
    ours = bo.pyggml_by_op(rows, makes)
    assert ours["MUL"] == {"forward": {"ok": 1}, "grad": {"fail": 1}}
    found = bo.compare(upstream, ours)
    assert [s.split(":")[0] for s in found["false_refusal"]] == ["GELU"]
    assert [s.split(":")[0] for s in found["upstream_blind"]] == ["ADD"]
    assert [s.split(":")[0] for s in found["upstream_fails"]] == ["MUL"]
    assert [s.split(":")[0] for s in found["grad_disagrees"]] == ["MUL", "SUB"]
    assert "first failing: ne=[2]" in found["grad_disagrees"][1]
    assert found["upstream_aborts"] == []
    upstream["grad"]["ops"]["GLU"] = {"cases": 0, "supported": 0, "passed": 0, "failed": [], "exit": -6,
                                      "abort": "ggml.c:7227: unsupported glu op for backward pass: REGLU"}
    assert bo.compare(upstream, ours)["upstream_aborts"] == [
        "GLU (grad): exit -6 after 0 cases: ggml.c:7227: unsupported glu op for backward pass: REGLU"]
    del upstream["grad"]["ops"]["GLU"]
    # support mode alone (nothing computed) still says what the CPU runs; upstream's own
    # failures come from test mode only
    only_support = bo.compare({"support": upstream["test"], "grad": upstream["grad"]}, ours)
    assert [s.split(":")[0] for s in only_support["false_refusal"]] == ["GELU"]
    assert only_support["upstream_fails"] == []
    text = bo.report({"test": {"cases": 20, "ops": upstream["test"]["ops"], "seconds": 1.0, "rc": 0}}, found)
    assert "test-backend-ops test -b CPU: 20 cases, 20 supported, 19 passed, 4 ops" in text
    assert "false-refusal candidates): 1" in text


def test_a_tree_without_the_test_program_and_no_sdist_is_an_error(tmp_path):
    with pytest.raises(bo.BackendOpsError, match="has no tests/test-backend-ops.cpp"):
        bo.find_source(tmp_path, tmp_path / "out")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / bo.SOURCE).write_text("int main() {}\n")
    assert bo.find_source(tmp_path, tmp_path / "out") == tmp_path / "tests" / bo.SOURCE


def test_a_run_past_its_time_kills_its_whole_process_group(tmp_path):
    t0 = time.monotonic()
    proc = bo._run(["bash", "-c", "sleep 100 & sleep 100"], tmp_path / "log", timeout=1)
    assert proc.returncode == 124 and time.monotonic() - t0 < 10
    assert "timed out after 1 s" in (tmp_path / "log").read_text()


FAKE_GGML = """\
cmake_minimum_required(VERSION 3.14)
project(fake_ggml C)
add_library(ggml STATIC ggml.c)
target_include_directories(ggml PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
"""

FAKE_TBO = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
extern "C" int fake_ggml_answer(void);
// prints what test-backend-ops prints: support mode through its SQL printer, grad mode on
// the console (a case's params on each of its lines, its verdict last, ANSI colours)
int main(int argc, char ** argv) {
    const char * mode = argc > 1 ? argv[1] : "test";
    if (argc < 4 || strcmp(argv[2], "-b") || strcmp(argv[3], "CPU")) return 3;
    const char * only = "";
    for (int i = 4; i + 1 < argc; i++) if (!strcmp(argv[i], "-o")) only = argv[i + 1];
    if (!strcmp(mode, "support")) {
        printf("CREATE TABLE IF NOT EXISTS test_backend_ops (op_name TEXT);\n");
        printf("INSERT INTO test_backend_ops (op_name, op_params, test_mode, supported, passed) "
               "VALUES ('ADD', 'answer=%d', 'support', '1', '1');\n", fake_ggml_answer());
        printf("INSERT INTO test_backend_ops (op_name, op_params, test_mode, supported, passed) "
               "VALUES ('GELU', 'type=bf16', 'support', '0', '0');\n");
        return 0;
    }
    printf("Testing 1 devices\n\n");
    if (!strcmp(only, "ADD")) {
        printf("  ADD(answer=%d): \033[1;32mOK\033[0m\n", fake_ggml_answer());
        printf("  SUM(answer=%d): \033[1;32mOK\033[0m\n", fake_ggml_answer());    // the same case
        printf("  ADD(type=f16): not supported [out->type != FP32]\n");
    }
    if (!strcmp(only, "GELU")) {
        printf("  GELU(type=f32,first): \033[1;32mOK\033[0m\n");
        printf("  GELU(type=f32,first): [GELU] MAA = 0.5 > 0.0001 \033[1;31mFAIL\033[0m\n");
        printf("  GELU(type=f32,second): \033[1;32mOK\033[0m\n");   // grad mode's "OK" before a case runs
        fprintf(stderr, "ggml.c:1: unsupported op for backward pass: GELU\n");
        abort();
    }
    return 0;
}
"""


@pytest.mark.skipif(not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))),
                    reason="needs CMake and a C++ compiler")
def test_the_program_is_built_against_the_tree_and_its_modes_are_read(tmp_path):
    tree = tmp_path / "ggml"
    (tree / "tests").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text(FAKE_GGML)
    (tree / "ggml.c").write_text("int fake_ggml_answer(void) { return 42; }\n")
    (tree / "tests" / bo.SOURCE).write_text(textwrap.dedent(FAKE_TBO))
    out = tmp_path / "out"
    rc = bo.main(["--tree", str(tree), "--out", str(out), "--json", str(tmp_path / "r.json")])
    assert (tmp_path / "r.json").exists(), (out / "log.txt").read_text()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert set(doc["upstream"]) == {"support", "grad"}          # the default modes (test is slow)
    assert doc["upstream"]["support"]["ops"] == {
        "ADD": {"cases": 1, "supported": 1, "passed": 1, "failed": []},          # linked: the tree's answer
        "GELU": {"cases": 1, "supported": 0, "passed": 0, "failed": []}}
    assert doc["upstream"]["support"]["rc"] == 0
    # grad runs per op, read from the console: GELU's run aborts in its second case (the
    # lines before it are kept: line buffered), ADD's is whole
    grad = doc["upstream"]["grad"]
    seconds = {name: op.pop("seconds") for name, op in grad["ops"].items()}       # each op's run's time
    assert set(seconds) == {"ADD", "GELU"} and all(0 <= s < 60 for s in seconds.values())
    assert grad["ops"]["ADD"] == {"cases": 2, "supported": 1, "passed": 1, "failed": []}
    assert grad["ops"]["GELU"] == {"cases": 2, "supported": 2, "passed": 0,
                                   "failed": ["type=f32,first", "type=f32,second"],
                                   "exit": -6, "abort": "ggml.c:1: unsupported op for backward pass: GELU"}
    assert grad["rc"] == -6 and grad["cases"] == 4
    assert rc == 1
    assert "answer=42" in (out / "log.txt").read_text()


def test_an_op_whose_run_does_not_end_is_named_and_the_others_still_run(tmp_path, monkeypatch):
    exe = tmp_path / "fake-backend-ops"
    exe.write_text("#!/bin/sh\n"
                   "[ \"$4\" = \"-o\" ] || exit 3\n"
                   "[ \"$5\" = SLOW ] && exec sleep 60\n"
                   "printf '  %s(ne=[1]): OK\\n' \"$5\"\n")
    exe.chmod(0o755)
    monkeypatch.setattr(bo, "OP_TIMEOUT_S", 1)
    t0 = time.monotonic()
    got = bo.run_mode(exe, "grad", tmp_path / "log", per_op=["ADD", "SLOW", "MUL"], jobs=2)
    assert time.monotonic() - t0 < 20
    assert "  slowest: SLOW 1" in bo.report({"grad": got}, {})       # where the mode's time went
    seconds = {name: op.pop("seconds") for name, op in got["ops"].items()}
    assert 1 <= seconds["SLOW"] < 20 and seconds["ADD"] < 1         # the killed run took its limit
    assert got["ops"]["ADD"] == got["ops"]["MUL"] == {"cases": 1, "supported": 1, "passed": 1, "failed": []}
    assert got["ops"]["SLOW"] == {"cases": 0, "supported": 0, "passed": 0, "failed": [], "exit": 124,
                                  "abort": "ran past 1 s (killed)"}
    assert bo.verdict(got["ops"]["SLOW"]) == "crashed" and bo.verdict(got["ops"]["ADD"]) == "ok"


def test_a_split_op_runs_as_two_halves_side_by_side_and_reads_as_one(tmp_path):
    """SHARDS: MUL_MAT's grad cases split by k's parity, and the second half is the first's
    complement (every case in exactly one, whatever its params, k or none); the two runs'
    verdicts merge into one entry."""
    rx, rest = bo.shards("MUL_MAT")
    cases = ["type_a=f32,type_b=f32,m=16,n=1,k=256,bs=[3,2]", "type_a=f16,type_b=f32,m=1057,n=1,k=129,bs=[1,1]",
             "type_a=f32,m=128,n=1,k=1057,o=1", "type_a=f32,m=16,n=2,k=1056,o=1", "no_k=1", "k=3,first"]
    halves = [[c for c in cases if re.search(r, "," + c + ",")] for r in (rx, rest)]
    assert halves == [[cases[0], cases[3]], [cases[1], cases[2], cases[4], cases[5]]]
    assert bo.shards("ADD") == (None,)
    calls = tmp_path / "calls"
    exe = tmp_path / "fake-backend-ops"
    exe.write_text("#!/bin/sh\n"
                   f"echo \"$5 $7\" >> {calls}\n"
                   "case \"$7\" in\n"
                   "  '^'*) printf '  %s(k=129): OK\\n  %s(k=1057): FAIL\\n' \"$5\" \"$5\"; exit 1 ;;\n"
                   "  ?*) printf '  %s(k=128): OK\\n' \"$5\" ;;\n"
                   "  *) printf '  %s(ne=[1]): OK\\n' \"$5\" ;;\n"
                   "esac\n")
    exe.chmod(0o755)
    got = bo.run_mode(exe, "grad", tmp_path / "log", per_op=["ADD", "MUL_MAT"], jobs=2, split=True)
    ran = [line.strip() for line in calls.read_text().splitlines()]
    assert sorted(ran) == sorted(["ADD", f"MUL_MAT {rx}", f"MUL_MAT {rest}"])
    mm = got["ops"]["MUL_MAT"]
    assert (mm["cases"], mm["supported"], mm["passed"], mm["failed"]) == (3, 3, 2, ["k=1057"])
    assert "exit" not in mm and got["cases"] == 4 and got["rc"] == 1
    assert list(got["ops"]) == ["ADD", "MUL_MAT"]        # in op order, whatever ran first
    assert bo.run_mode(exe, "grad", tmp_path / "log", per_op=["MUL_MAT"], split=False)["ops"]["MUL_MAT"]["cases"] == 1
    calls.unlink()
    bo.run_mode(exe, "grad", tmp_path / "log", per_op=["ADD", "MUL_MAT"], jobs=1, split=True)
    ran = [line.strip() for line in calls.read_text().splitlines()]
    assert ran == [f"MUL_MAT {rx}", f"MUL_MAT {rest}", "ADD"]       # the split op's runs start first
