"""The generic parity harness (pyggml.parity): subjects, paths, crash isolation, reports,
saved results and their diff, and the command line."""

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import pyggml
from pyggml import parity
from pyggml.parity import report, runner, store
from pyggml.parity.model import compare_outputs
from sources import built_from_the_pin, load_script

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

PY = sys.executable


def cli(*args, cwd=None, timeout=600):
    return subprocess.run([PY, "-m", "pyggml", *args], capture_output=True, text=True, cwd=cwd or "/",
                          timeout=timeout)


def lacked(r) -> bool:
    """A row skipped because the linked ggml, a release other than the pin, lacks what it
    needs (ggml_cplan.use_ref for the ggml-ref path, an op): the sweep says which."""
    return (r.verdict == "skipped" and r.detail.startswith(f"ggml {pyggml.ggml_version()} lacks ")
            and not built_from_the_pin())


def test_op_subjects_agree_along_every_path():
    rows = parity.check(["soft_max_ext", "rms_norm", "cumsum"], quick=True)
    # a device other than the CPU (backend:BLAS) skips the ops its supports_op refuses
    on_devices = [r for r in rows if any(p.startswith("backend:") for p in (r.a, r.b))]
    assert all(r.verdict == "skipped" and "supports_op" in r.detail for r in on_devices)
    rows = [r for r in rows if r not in on_devices and not lacked(r)]
    assert rows and {r.verdict for r in rows} == {"ok"}
    pairs = {(r.a, r.b) for r in rows}
    assert ("ggml", "reference") in pairs
    if pyggml.build_info()["features"]["use_ref"]:
        assert ("ggml-ref", "reference") in pairs and ("ggml", "ggml-ref") in pairs
    assert all(r.b == "reference" or "reference" not in (r.a, r.b) for r in rows)
    assert all(r.nmse is not None and r.nmse <= r.tol for r in rows)
    ref_rows = [r for r in rows if r.b == "reference"]
    assert all(r.seed == 0 and r.case for r in ref_rows)


def test_gradient_subjects_compare_autodiff_with_central_differences():
    rows = parity.check("grad:mul_mat", quick=True)
    assert rows and all((r.a, r.b) == ("autodiff", "reference") and r.verdict == "ok" for r in rows)
    assert max(r.nmse for r in rows) < 1e-10


def test_known_defects_are_refused_rows():
    cases = [c for c in runner.select(["rope_ext_back"]) if "odd ne0" in c.label]
    assert cases
    rows, _ = runner.run_cases(cases[:1])
    ggml_rows = [r for r in rows if "ggml" in (r.a, r.b)]
    assert ggml_rows and all(r.verdict == "refused" and r.defect == "rope-odd-ne0" for r in ggml_rows)


def test_a_wrong_path_fails_with_a_reproducer():
    s = parity.FunctionSubject("tests_scaled", inputs=lambda rng: (rng.standard_normal(16),),
                               paths={"ggml": lambda x: x * 1.001, "reference": lambda x: x})
    s.repro = lambda case: f"print('case {case.index}')\n"
    parity.register_subject(s)
    rows = parity.check("tests_scaled")
    assert len(rows) == 8 and all(r.verdict == "fail" and r.nmse == pytest.approx(1e-6, rel=1e-3) for r in rows)
    assert rows[0].repro == "print('case 0')\n"
    text = report.format_summary(rows)
    assert "tests_scaled" in text and "print('case 0')" in text


def test_paths_must_exist_and_differ_on_the_command_line():
    for args, msg in [(["--paths", "foo,ggml"], "unknown foo"), (["--paths", "ggml,ggml"], "compared with itself"),
                      (["--paths", "ggml"], "at least two paths"), (["--workers", "-1"], "--workers"),
                      (["--timeout", "0"], "--timeout"), (["--op", "no_such_op"], "nothing to compare"),
                      (["--types", "F33"], "unknown F33")]:
        proc = cli("parity", *args)
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_version_and_a_closed_pipe():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()})"
    p = subprocess.run(f"{PY} -m pyggml demo | head -1", shell=True, capture_output=True, text=True, cwd="/")
    assert p.stdout.startswith("pyggml ") and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_command_writes_json_junit_and_saves(tmp_path):
    js, xml, npz = tmp_path / "p.json", tmp_path / "p.xml", tmp_path / "p.npz"
    # the paths every build has (a BLAS build's backend:BLAS would add skipped rows), and an
    # op every release has
    proc = cli("parity", "--op", "argmax", "--op", "grad:sqr", "--quick", "--workers", "1", "--json", str(js),
               "--junit", str(xml), "--save", str(npz), "--paths", "ggml,ggml-ref,cpu-backend,reference,autodiff")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(js.read_text())
    assert set(doc) == {"rows", "summary", "meta"} and doc["summary"]["fail"] == 0
    row = doc["rows"][0]
    assert set(row) >= {"op", "case", "seed", "a", "b", "nmse", "max_abs", "verdict", "repro"}
    assert {r["subject"] for r in doc["rows"]} == {"op:argmax", "grad:sqr"}
    assert doc["meta"]["identity"]["ggml_version"] == pyggml.ggml_version()
    suite = ET.parse(xml).getroot()
    assert suite.get("tests") == str(len(doc["rows"])) and suite.get("failures") == "0"
    meta, kept = store.load(str(npz))
    assert meta["identity"]["cpu_features"] == sorted(k for k, v in pyggml._cpu.cpu_features().items() if v)
    key = next(iter(kept))
    # what parity diff reads: the compared paths' arrays, each one's NMSE against the
    # reference (worst and per array) and the reference's sketch (not the reference itself)
    assert "ggml" in kept[key] and "reference" not in kept[key] and "cpu-backend" not in kept[key]
    assert meta["format"] == 3 and set(meta["nmse_ref"][key]) == set(kept[key]) and meta["sketches"][key]
    assert set(meta["nmse_arrays"][key]) == set(kept[key])
    if pyggml.build_info()["features"]["use_ref"]:     # (else the ggml-ref rows are skipped)
        assert "(2 more subjects: all ok)" in proc.stdout


def test_save_writes_the_path_it_is_given(tmp_path):
    # numpy's savez adds ".npz" to a name without it; pyggml writes (and reports) the name given
    out = tmp_path / "sweep.txt"
    proc = cli("parity", "--op", "soft_max", "--types", "F32", "--quick", "--workers", "0", "--save", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"to {out}" in proc.stdout and out.exists() and not (tmp_path / "sweep.txt.npz").exists()
    meta, kept = store.load(str(out))
    assert kept and meta["identity"]["ggml_version"] == pyggml.ggml_version()


def swept(ops, types, quick):
    """What pyggml parity --save keeps, run in this process: ({case key: {path: arrays}},
    the meta the command saves with it: labels and tolerances)."""
    cases = runner.select(ops, types, quick)
    _, kept = runner.run_cases(cases, None, 0, keep=True)
    subjects = parity.subjects.all_subjects()
    return kept, {"labels": {c.key: c.label for c in cases},
                  "tolerances": {c.key: subjects[c.subject].tolerance(c, "ggml", "ggml-ref") for c in cases}}


def save_format_1(path, kept, meta):
    """A file as --save wrote it before format 2 (every path, the references whole): what
    load() must still read."""
    arrays = {"||".join((key, p, str(i))): np.asarray(a) for key, paths in kept.items()
              for p, arrs in paths.items() for i, a in enumerate(arrs)}
    arrays["__meta__"] = np.frombuffer(json.dumps({"identity": store.build_identity(), "meta": meta}).encode(),
                                       np.uint8)
    np.savez_compressed(str(path), **arrays)


def test_diff_of_two_saved_sweeps(tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    for p in (a, b):
        proc = cli("parity", "--op", "soft_max", "--types", "F32", "--quick", "--workers", "0", "--save", str(p))
        assert proc.returncode == 0, proc.stderr[-2000:]
    same = cli("parity", "diff", str(a), str(b))
    assert same.returncode == 0 and "0 differ" in same.stdout, same.stdout
    # B with one output nudged: that case differs, and A is the one closer to the reference
    meta = store.load(str(b))[0]
    kept = swept(["soft_max"], ["F32"], True)[0]
    key = sorted(k for k in kept if "ggml" in kept[k])[0]
    kept[key]["ggml"] = [x * 1.01 for x in kept[key]["ggml"]]
    store.save(str(b), kept, meta["meta"])
    differ = cli("parity", "diff", str(a), str(b))
    assert differ.returncode == 1 and "1 differ, 1 beyond" in differ.stdout, differ.stdout
    name = "|".join(key.split("|")[:2] + [meta["meta"]["labels"][key]])     # cases are named by label
    line = next(ln for ln in differ.stdout.splitlines() if ln.startswith(name + " "))   # the whole name
    assert line.split()[-1] == "A"


def test_diff_matches_cases_by_label_and_skips_those_drawn_from_other_inputs(tmp_path):
    # two builds may draw different sample lists for one subject (a release lacks a sample):
    # the same index is then another case, and a case of one label may hold other inputs
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    kept, meta = swept(["soft_max"], ["F32"], False)
    store.save(str(a), kept, meta)
    meta = {"meta": meta}
    labels = meta["meta"]["labels"]
    keys = sorted((k for k in kept if k.startswith("op:soft_max|F32|")), key=lambda k: int(k.rsplit("|", 1)[1]))
    assert len(keys) >= 3 and len({labels[k] for k in keys}) == len(keys)
    # B: sample 0 dropped, the rest shifted down one index; the last one's inputs redrawn
    shifted = {k: v for k, v in kept.items() if k not in keys}
    new_labels = {}
    for old, new in zip(keys[1:], keys):
        shifted[new], new_labels[new] = kept[old], labels[old]
    last = keys[len(keys) - 2]
    shifted[last] = {p: [x + 1.0 for x in v] for p, v in kept[keys[-1]].items()}
    store.save(str(b), shifted, {**meta["meta"], "labels": new_labels})
    got = cli("parity", "diff", str(a), str(b), "--json", str(tmp_path / "d.json"))
    doc = json.loads((tmp_path / "d.json").read_text())
    assert got.returncode == 0 and "0 differ" in got.stdout, got.stdout
    assert doc["not_comparable"] == [f"op:soft_max|F32|{labels[keys[-1]]}"]
    assert "not compared: 1 cases" in got.stdout
    assert doc["per_op"]["op:soft_max"]["outputs"] > 0
    # a file saved before labels were: cases by index, as then; every index now holds other
    # inputs, which the references show: none compared, none reported as a difference
    store.save(str(b), shifted, {k: v for k, v in meta["meta"].items() if k != "labels"})
    old = cli("parity", "diff", str(a), str(b))
    assert old.returncode == 0 and f"not compared: {len(keys) - 1} cases" in old.stdout, old.stdout


def test_a_compact_save_gives_the_same_diff_as_the_whole_arrays_in_far_fewer_bytes(tmp_path):
    """--save keeps what parity diff reads: the same verdicts (bitwise, beyond tolerance,
    closer to the reference) and inputs check as from files with every path and the whole
    float64 references (format 1, which load() still reads), in far fewer bytes. Format 3
    keeps a large output close to its reference as digests: here every output of more
    than 4 values (the default, 4096, leaves the quick sweep's outputs whole); its NMSE
    and max abs against the other file are then bounds of the true ones."""
    kept, meta = swept(["soft_max", "rms_norm", "mul_mat", "attention", "grad:exp"], [], True)
    other = {k: {p: [np.asarray(x).copy() for x in v] for p, v in paths.items()} for k, paths in kept.items()}

    def digestible(k):                  # what format 3 keeps as digests, with whole_max=4
        ggml, ref = kept[k].get("ggml"), kept[k].get("reference")
        return ggml is not None and ref is not None and len(ggml) == len(ref) and store._summarizable(
            ggml, [compare_outputs([x], [r])[0] for x, r in zip(ggml, ref)], meta["tolerances"][k], 4)
    keys = sorted(k for k in other if k.startswith("op:") and digestible(k))
    other[keys[0]]["ggml"] = [x * 1.1 for x in other[keys[0]]["ggml"]]                 # beyond tolerance
    other[keys[1]]["ggml"] = [np.nextafter(x, np.inf) if x.dtype.kind == "f" else x
                              for x in other[keys[1]]["ggml"]]                           # one ulp: bits differ
    other[keys[2]] = {p: [x + 1.0 for x in v] for p, v in other[keys[2]].items()}       # other inputs
    att = next(k for k in other if k.startswith("attention") and "autodiff" in other[k])
    other[att]["autodiff"] = [x * (1 + 1e-6) for x in other[att]["autodiff"]]          # autodiff XOR-coded
    nan = keys[3]                                                                        # a NaN, kept whole
    other[nan]["ggml"] = [x.copy() for x in other[nan]["ggml"]]
    other[nan]["ggml"][0].reshape(-1)[0] = np.nan
    writers = {"1": save_format_1, "2": lambda p, k, m: store.save(p, k, m, whole_max=None),   # all kept
               "3": lambda p, k, m: store.save(p, k, m, whole_max=4)}
    files = {}
    for fmt, write in writers.items():
        for side, data in (("a", kept), ("b", other)):
            files[fmt + side] = tmp_path / f"{side}{fmt}.npz"
            write(str(files[fmt + side]), data, meta)
    whole = store.diff(str(files["1a"]), str(files["1b"]))
    compact = store.diff(str(files["2a"]), str(files["2b"]))
    mixed = store.diff(str(files["1a"]), str(files["2b"]))
    assert whole[2] == compact[2] == mixed[2] and len(whole[2]) > 50
    assert whole[0]["not_comparable"] == compact[0]["not_comparable"] == mixed[0]["not_comparable"]
    assert len(whole[0]["not_comparable"]) == 1
    assert {d.bitwise for d in compact[2]} == {True, False} and any(d.beyond for d in compact[2])
    assert any(d.path == "autodiff" and not d.bitwise for d in compact[2])

    def verdicts(diffs):
        return {(d.case, d.path): (d.bitwise, d.beyond, d.closer, d.undecided) for d in diffs}
    truth = {(d.case, d.path): d for d in whole[2]}
    n_bounded = 0
    for a, b in (("3a", "3b"), ("1a", "3b"), ("3a", "2b")):
        got = store.diff(str(files[a]), str(files[b]))
        assert verdicts(got[2]) == verdicts(whole[2]), (a, b)
        assert got[0]["not_comparable"] == whole[0]["not_comparable"]
        for d in got[2]:
            t = truth[(d.case, d.path)]
            if d.exact:
                assert d == t
            else:                                      # bounds of the true values
                n_bounded += 1
                assert d.nmse_low <= t.nmse <= d.nmse and t.max_abs <= d.max_abs, (d, t)
    assert n_bounded >= 6               # the nudged outputs below, in each pair with a digest file
    # the nudged outputs are among those bounded: a beyond, a one-ulp difference, autodiff
    got = {(d.case, d.path): d for d in store.diff(str(files["3a"]), str(files["3b"]))[2]}
    by_key = {v: k for k, v in store._by_name(meta["labels"], kept).items()}
    assert not got[(by_key[keys[0]], "ggml")].exact and got[(by_key[keys[0]], "ggml")].beyond
    assert not got[(by_key[keys[1]], "ggml")].exact and not got[(by_key[keys[1]], "ggml")].bitwise
    assert not got[(by_key[att], "autodiff")].exact and not got[(by_key[att], "autodiff")].bitwise
    assert got[(by_key[nan], "ggml")].beyond and truth[(by_key[nan], "ggml")].beyond
    # every array kept comes back exactly (its bits), the compared paths only
    for fmt in "23":
        doc, back = store.load(str(files[fmt + "b"]))
        digested = {tuple(n.split("||")) for n in doc["summaries"]}
        assert (fmt == "3") == bool(digested)
        for key, paths in back.items():
            assert set(paths) | {p for k, p in digested if k == key} == set(other[key]) & set(store.SAVED_PATHS)
            for p, arrs in paths.items():
                assert all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == np.asarray(y).tobytes()
                           for x, y in zip(arrs, other[key][p]))
    size = {k: f.stat().st_size for k, f in files.items()}
    assert size["2a"] * 3 < size["1a"] and size["3a"] * 2 < size["2a"], size    # the full sweep's: attention guide
    # scripts/check_saved_digests.py, which checked this on two real builds, says the same
    check = load_script("check_saved_digests")
    assert check.main([str(files[k]) for k in ("2a", "3a", "2b", "3b")]) == 0
    assert check.main([str(files[k]) for k in ("2a", "3a", "2b", "3a")]) == 1       # B's digests from A: caught


def test_a_verdict_the_digests_cannot_give_is_undecided_not_guessed(tmp_path):
    """An output kept as digests in A, against one kept whole in B whose own error from
    the reference is the tolerance itself: the bounds straddle it, and diff says the
    output is undecided (exit status 1) and how to decide it, rather than pick a side."""
    kept, meta = swept(["soft_max"], ["F32"], True)
    key = next(k for k in sorted(kept) if "ggml" in kept[k] and sum(np.size(x) for x in kept[k]["ggml"]) > 4)
    tol = meta["tolerances"][key]
    other = {k: dict(v) for k, v in kept.items()}
    other[key]["ggml"] = [(r * (1 + np.sqrt(tol))).astype(x.dtype) for x, r in zip(kept[key]["ggml"],
                                                                                    kept[key]["reference"])]
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    assert store.save(str(a), kept, meta, whole_max=4)[1] > 0
    assert store.save(str(b), other, meta, whole_max=4)[1] < store.save(str(a), kept, meta, whole_max=4)[1]
    name = next(n for n, k in store._by_name(meta["labels"], kept).items() if k == key)
    d = next(d for d in store.diff(str(a), str(b))[2] if d.case == name and d.path == "ggml")
    assert d.undecided and not d.beyond and not d.exact and d.nmse_low <= tol < d.nmse
    proc = cli("parity", "diff", str(a), str(b))
    assert proc.returncode == 1 and "1 undecided" in proc.stdout and "--save-whole" in proc.stdout, proc.stdout
    # with every array kept, the same pair is decided
    store.save(str(a), kept, meta, whole_max=None)
    exact = next(d for d in store.diff(str(a), str(b))[2] if d.case == name and d.path == "ggml")
    assert exact.exact and not exact.undecided and d.nmse_low <= exact.nmse <= d.nmse


def test_digests_are_equal_exactly_when_the_values_are():
    x = np.linspace(-1, 1, 101, dtype=np.float32)
    assert store._digest(x) == store._digest(x.copy())
    assert store._digest(np.float32(-0.0) * np.ones(3, np.float32)) == store._digest(np.zeros(3, np.float32))
    assert store._digest(np.nextafter(x, np.float32(2))) != store._digest(x)
    assert store._digest(x.reshape(1, 101)) != store._digest(x)
    assert store._digest(x.astype(np.float16)) != store._digest(x)


def test_save_whole_needs_save():
    proc = cli("parity", "--op", "soft_max", "--save-whole")
    assert proc.returncode == 2 and "--save-whole" in proc.stderr, proc.stderr


PLANTED = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from pyggml import parity

    def ggml_path(x):
        if abs(x[0] - CRASH_AT) < 1e-12:
            os.kill(os.getpid(), signal.SIGSEGV)        # a crash inside a kernel, as it looks
        if abs(x[0] - HANG_AT) < 1e-12:
            time.sleep(60)
        return x

    def inputs(rng):
        return (np.array([float(rng.integers(0, 4))]),)

    parity.register_subject(parity.FunctionSubject("planted", inputs, {"ggml": ggml_path, "reference": lambda x: x},
                                                   n_cases=6))
    CRASH_AT, HANG_AT = 2.0, 1.0           # cases 1, 3, 5 crash, case 4 hangs (their first draws)

    if __name__ == "__main__":
        cases = parity.select(["planted"])
        if sys.argv[1:] == ["one-by-one"]:          # a pool that stays, handed one case at a time (pytest's)
            from pyggml.parity.runner import WorkerPool
            with WorkerPool(1, timeout=8, batch=1) as pool:
                rows = [r for c in cases for r in pool.run([c])[0]]
        else:
            rows, _ = parity.run_cases(cases, workers=1, timeout=8)
        for c, r in zip(cases, rows):
            print(c.index, r.verdict, r.detail.split(";")[0])
""")


@pytest.mark.parametrize("mode", ["batches", "one-by-one"])
def test_a_crash_or_hang_in_a_worker_is_a_row_and_the_sweep_goes_on(tmp_path, mode):
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    proc = subprocess.run([PY, str(script), *([mode] if mode != "batches" else [])], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {int(line.split()[0]): line.split(None, 2)[1:] for line in proc.stdout.splitlines()}
    rng_first = {i: float(np.random.default_rng([0, i]).integers(0, 4)) for i in range(6)}
    assert len(got) == 6
    for i, first in rng_first.items():
        verdict = got[i][0]
        want = {2.0: "crashed", 1.0: "timeout"}.get(first, "ok")
        assert verdict == want, (i, first, got[i])
    crashed = [v for v in got.values() if v[0] == "crashed"]
    assert crashed and all("SIGSEGV" in v[1] for v in crashed)


def test_ggml_ref_is_the_reference_implementation_switch():
    if not pyggml.build_info()["features"]["use_ref"]:
        assert not built_from_the_pin()
        pytest.skip(f"ggml {pyggml.ggml_version()} has no ggml_cplan.use_ref")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 600, 64)).astype(np.float32)      # long enough for ggml's tiled path
    with pyggml.Context(256 << 20) as ctx:
        tq = ctx.from_numpy(q[0].transpose(1, 0, 2).copy())
        k = ctx.from_numpy(rng.standard_normal((4, 600, 64)).astype(np.float16).transpose(1, 0, 2).copy())
        v = ctx.from_numpy(rng.standard_normal((4, 600, 64)).astype(np.float16).transpose(1, 0, 2).copy())
        r = pyggml.flash_attn_ext(ctx, pyggml.permute(ctx, tq, 0, 2, 1, 3), pyggml.permute(ctx, k, 0, 2, 1, 3),
                                  pyggml.permute(ctx, v, 0, 2, 1, 3), None, 0.125, 0.0, 0.0)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        g.compute(2)
        fast = r.numpy().copy()
        g.compute(2, use_ref=True)
        ref = r.numpy().copy()
    err = float(np.sum((fast - ref) ** 2) / np.sum(ref ** 2))
    assert 0 < err < 1e-3          # two implementations of the same thing: close, not the same bits


def test_pytest_sweep_under_xdist_agrees_with_pyggml_parity(tmp_path):
    ops = ["--pyggml-sweep-op", "soft_max*", "--pyggml-sweep-op", "grad:rms_norm", "--pyggml-sweep-op", "grad:add1"]
    sweep = tmp_path / "sweep.json"
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--pyggml-sweep",
                           "--pyggml-sweep-quick", *ops, "--pyggml-sweep-json", str(sweep)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "skipped" in proc.stdout            # grad:add1: refused, a known defect
    mine = tmp_path / "parity.json"
    par = cli("parity", "--quick", "--op", "soft_max*", "--op", "grad:rms_norm", "--op", "grad:add1",
              "--json", str(mine))
    assert par.returncode == 0, par.stdout[-2000:]

    def index(path):
        return {(r["subject"], r["type"], r["index"], r["a"], r["b"]): (r["verdict"], r["nmse"])
                for r in json.loads(path.read_text())["rows"]}
    a, b = index(sweep), index(mine)
    assert len(a) > 30 and a == b


def test_pytest_sweep_runs_a_subject_of_the_sessions_own_in_its_process(tmp_path):
    # a conftest's subject is unknown to a fresh parity worker: the plugin runs it in the
    # pytest process (and a bad case is a failed item with the row's detail)
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import numpy as np
        from pyggml import parity
        parity.register_subject(parity.FunctionSubject(
            "mine", lambda rng: (rng.standard_normal(4),),
            {"ggml": lambda x: x * (1.5 if x[0] > 0.0 else 1.0), "reference": lambda x: x}, n_cases=8))
    """))
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyggml-sweep",
                           "--pyggml-sweep-op", "mine"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    firsts = [np.random.default_rng([0, i]).standard_normal(4)[0] for i in range(8)]
    bad = sum(f > 0.0 for f in firsts)
    assert 0 < bad < 8, firsts              # the seeds give both outcomes
    assert f"{bad} failed, {8 - bad} passed" in proc.stdout, proc.stdout[-3000:]
    assert "ggml~reference: fail: NMSE" in proc.stdout


def test_a_planted_overrun_is_an_oob_row_with_its_tensor():
    # with pyggml's kernel rules off, rope_ext_back's odd-ne0 case reaches the kernel,
    # which writes one element past each row: the guarded probe sees it
    from pyggml.opinfo.harness import rules_disabled
    cases = [c for c in runner.select(["rope_ext_back"], ["F32"]) if "odd ne0" in c.label][:1]
    with rules_disabled():
        rows, _ = runner.run_cases(cases, paths=["ggml", "reference"])
    assert [r.verdict for r in rows] == ["oob"]
    assert "past" in rows[0].detail and rows[0].repro


def test_the_torch_path_agrees_with_the_reference():
    pytest.importorskip("torch")
    rows = parity.check(["sqr", "mul_mat", "soft_max", "rms_norm"], paths=["ggml", "reference", "torch"],
                        types=["F32"], quick=True)
    torch_rows = [r for r in rows if "torch" in (r.a, r.b)]
    assert {(r.a, r.b) for r in torch_rows} == {("torch", "reference"), ("ggml", "torch")}
    assert torch_rows and all(r.verdict == "ok" for r in torch_rows), [r for r in torch_rows if r.verdict != "ok"]
    assert max(r.nmse for r in torch_rows if r.b == "reference") > 0      # float32 against float64: not identical


def test_a_registered_path_is_compared_with_every_other():
    from pyggml.opinfo import harness
    from pyggml.parity import subjects

    def two_threads(info, sample, n_threads):
        return harness.compute(info, sample, 2)[0]

    def off_by_a_bit(info, sample, n_threads):
        return harness.compute(info, sample, 1)[0] * (1 + 1e-2)

    parity.register_path("two-threads", two_threads, ops=["mul_mat"])
    parity.register_path("off-by-a-bit", off_by_a_bit, ops=["soft_max"])
    try:
        rows = parity.check(["mul_mat", "soft_max"], types=["F32"], quick=True)
        mine = [r for r in rows if r.a == "two-threads" or r.b == "two-threads"]
        assert mine and {r.subject for r in mine} == {"op:mul_mat"}
        # every pair with it agrees; a device other than the CPU skips the small products
        assert all(r.verdict == "ok" or (r.verdict == "skipped" and "backend:" in r.a + r.b) or lacked(r)
                   for r in mine)
        off = [r for r in rows if "off-by-a-bit" in (r.a, r.b) and "backend:" not in r.a + r.b and not lacked(r)]
        assert off and all(r.verdict == "fail" and r.repro for r in off)
        bad = cli("parity", "--paths", "ggml,nonesuch")
        assert bad.returncode == 2 and "unknown nonesuch" in bad.stderr
        with pytest.raises(ValueError):
            parity.register_path("ggml", two_threads)
    finally:
        subjects._USER_PATHS.clear()
