#!/usr/bin/env python3
"""The checks of ``scripts/gpu_check.sh``, on an installed pyggml: one device of the linked
ggml (``--device CUDA0``, the first CUDA device by default) against float64 and the CPU.

Steps, each timed and given a verdict (ok / FAIL / skipped) in one summary table and in
``OUT/gpu_check.json``:

1. ``info``: the build (``pyggml.build_info()``) and the devices ggml registered; the device
   under test must be there.
2. ``tests``: the backend tests (``tests/test_backend*.py``, ``tests/test_backend_devices.py``
   with ``PYGGML_TEST_DEVICE`` set to the device), under pytest with
   ``PYGGML_REQUIRE_BACKENDS`` naming the device, so that nothing skips for want of it.
3. ``parity``: the parity sweep's ``backend:DEVICE`` path with the float64 reference, over
   every registry op (``python -m pyggml parity --paths backend:DEVICE,ggml,reference``): every
   row the device computes is judged by float64, next to the CPU kernel's row.
4. ``llama``: the examples guide's Llama-style block (at width 256, 32 tokens), allocated in the
   device's buffers and compared node by node with the CPU (``compare_graph_backend``), and
   its output against the same block computed by the CPU.
5. ``attention``: ggml's ``flash_attn_ext`` on the device (F16 K/V, causal mask, GQA, head
   sizes 64 and 128) against a float64 softmax attention and against the CPU's kernel.

``--dry-run`` runs the same steps with the CPU backend in place of the device (no GPU
needed): the script's own test (``.ci/run``), so that it works the first time it meets a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from pyggml._machine import cpu_model, usable_cores

ROOT = Path(__file__).resolve().parent.parent
FA_NMSE = 5e-4


class Check:
    def __init__(self, name: str) -> None:
        self.name = name
        self.verdict = "skipped"
        self.summary = ""
        self.details: dict = {}
        self.seconds = 0.0


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int, str]:
    """Run ``cmd`` (its output to ``log``); the return code (124 past ``timeout``) and the
    output's last lines."""
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    text = log.read_text(errors="replace")
    return rc, "\n".join(text.strip().splitlines()[-3:])


def check_info(c: Check, device: str, pyggml) -> None:
    info = pyggml.build_info()
    devices = pyggml.backends()
    c.details = {"build_info": info, "devices": devices, "python": sys.version.split()[0],
                 "machine": platform.machine(), "cpu": cpu_model(), "usable_cores": usable_cores()}
    names = [d["name"] for d in devices]
    if device not in names:
        c.verdict, c.summary = "FAIL", f"{device} is not among the devices ggml registered: {names}"
        return
    d = next(d for d in devices if d["name"] == device)
    c.verdict = "ok"
    c.summary = f"{device}: {d.get('description', '')} ({d.get('type')}); ggml {info.get('ggml_version')}; devices {names}"


def check_tests(c: Check, device: str, out: Path, jobs: int, timeout: float) -> None:
    junit = out / "junit-backend.xml"
    # PYGGML_REQUIRE_BACKENDS: device names (tests/test_backend_multi.py), CUDA0 not CUDA
    env = dict(os.environ, PYGGML_TEST_DEVICE=device, PYGGML_REQUIRE_BACKENDS=device)
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_backend*.py"))
    files += ["tests/test_opt.py"]
    # -P: the source tree's pyggml (no compiled modules) must not shadow the installed one
    cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
           f"--junitxml={junit}", *files]
    if jobs > 1:
        cmd += ["-n", str(jobs)]
    rc, tail = _run(cmd, env, out / "tests.log", timeout)
    counts = _junit_counts(junit)
    c.details = {"command": " ".join(cmd), "rc": rc, "counts": counts, "files": files}
    c.verdict = "ok" if rc == 0 and counts.get("tests", 0) > 0 else "FAIL"
    c.summary = (f"{counts.get('tests', 0)} tests: {counts.get('failures', 0)} failed, "
                 f"{counts.get('errors', 0)} errors, {counts.get('skipped', 0)} skipped (rc {rc})")
    if c.verdict == "FAIL":
        c.summary += "; " + tail.replace("\n", " | ")


def _junit_counts(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    suites = [root] if root.tag == "testsuite" else list(root)
    counts: dict[str, int] = {}
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            counts[k] = counts.get(k, 0) + int(s.get(k, 0))
    return counts


def check_parity(c: Check, device: str, out: Path, jobs: int, quick: bool, timeout: float) -> None:
    report = out / "parity.json"
    path = "cpu-backend" if device == "CPU" else f"backend:{device}"
    cmd = [sys.executable, "-P", "-m", "pyggml", "parity", "--paths", f"{path},ggml,reference",
           "--workers", str(jobs), "--timeout", str(min(60.0, timeout / 2)), "--json", str(report)]
    if quick:
        cmd.append("--quick")
    rc, tail = _run(cmd, dict(os.environ), out / "parity.log", timeout)
    c.details = {"command": " ".join(cmd), "rc": rc}
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        c.verdict, c.summary = "FAIL", f"no report (rc {rc}): {tail}"
        return
    rows = [r for r in _rows(data) if path in (r.get("a"), r.get("b"))]
    tally: dict[str, int] = {}
    for r in rows:
        tally[r["verdict"]] = tally.get(r["verdict"], 0) + 1
    bad = [r for r in rows if r["verdict"] not in ("ok", "skipped", "refused")]
    worst = max((float(r["nmse"]) for r in rows if r["verdict"] == "ok" and r.get("nmse") is not None), default=None)
    sites = _abort_sites(bad)
    c.details.update({"path": path, "verdicts": tally, "not_ok": bad[:300], "worst_ok_nmse": worst,
                      "abort_sites": sites, "ops_not_ok": sorted({r["op"] for r in bad})})
    c.verdict = "ok" if rc == 0 and rows and not bad else "FAIL"
    c.summary = (f"{path}: {len(rows)} rows: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
                 + (f"; worst NMSE of the ok rows {worst:.2e}" if worst is not None else "")
                 + (f"; {len(sites)} places in ggml aborted: " + ", ".join(f"{k} ({v})" for k, v in
                                                                          list(sites.items())[:6]) if sites else "")
                 + f" (rc {rc})")


def _abort_sites(rows: list[dict]) -> dict[str, int]:
    """Where in ggml's sources the crashed rows aborted (``file.cu:line``), most first."""
    import re
    sites: dict[str, int] = {}
    for r in rows:
        m = re.search(r"ggml/src/(\S+?:\d+)", r.get("detail", ""))
        if m:
            sites[m.group(1)] = sites.get(m.group(1), 0) + 1
    return dict(sorted(sites.items(), key=lambda kv: -kv[1]))


def _rows(data) -> list[dict]:
    """The rows of ``pyggml parity --json``'s report: one per (case, path)."""
    return list(data.get("rows", [])) if isinstance(data, dict) else []


def _llama_block(pyggml, ctx, W, x0, T, d, H):
    """The Llama-style block of docs/site/guides/examples.md (tests/test_readme.py runs that copy), from
    the embedded tokens ``x0`` on: ``compare_graph_backend`` takes no graph with an index op
    (get_rows reads rows at positions it cannot check there), and the sweep checks get_rows.
    Returns the output and {leaf: its value}, set by the caller once allocated."""
    from pyggml import Type
    hd = d // H
    w = {k: ctx.new_tensor(Type.F32, tuple(reversed(v.shape))) for k, v in W.items()}
    x = ctx.new_tensor(Type.F32, (d, T))
    pos = ctx.new_tensor(Type.I32, (T,))
    causal = ctx.new_tensor(Type.F32, (T, T))

    def heads(t):
        t = pyggml.reshape_3d(ctx, t, hd, H, T)
        t = pyggml.rope_ext(ctx, t, pos, None, hd, pyggml.RopeType.NEOX, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
        return pyggml.permute(ctx, t, 0, 2, 1, 3)

    inputs = {**{w[k]: W[k] for k in W}, x: x0, pos: np.arange(T, dtype=np.int32),
              causal: np.triu(np.full((T, T), -np.inf, np.float32), 1)}
    n = pyggml.mul(ctx, pyggml.rms_norm(ctx, x, 1e-5), w["norm1"])
    q, k = heads(pyggml.mul_mat(ctx, w["wq"], n)), heads(pyggml.mul_mat(ctx, w["wk"], n))
    v = pyggml.reshape_3d(ctx, pyggml.mul_mat(ctx, w["wv"], n), hd, H, T)
    vt = pyggml.cont(ctx, pyggml.permute(ctx, v, 1, 2, 0, 3))
    p = pyggml.soft_max_ext(ctx, pyggml.mul_mat(ctx, k, q), causal, hd ** -0.5, 0.0)
    o = pyggml.cont(ctx, pyggml.permute(ctx, pyggml.mul_mat(ctx, vt, p), 0, 2, 1, 3))
    x = pyggml.add(ctx, x, pyggml.mul_mat(ctx, w["wo"], pyggml.reshape_2d(ctx, o, d, T)))
    n = pyggml.mul(ctx, pyggml.rms_norm(ctx, x, 1e-5), w["norm2"])
    f = pyggml.swiglu_split(ctx, pyggml.mul_mat(ctx, w["gate"], n), pyggml.mul_mat(ctx, w["up"], n))
    x = pyggml.add(ctx, x, pyggml.mul_mat(ctx, w["down"], f))
    return x, inputs


def check_llama(c: Check, device: str, pyggml) -> None:
    d, H, T, vocab, ff = 256, 8, 32, 1000, 512
    rng = np.random.default_rng(0)
    W = {name: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
         for name, shape in [("emb", (vocab, d)), ("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)),
                             ("wo", (d, d)), ("gate", (ff, d)), ("up", (ff, d)), ("down", (d, ff))]}
    W["norm1"] = W["norm2"] = np.ones(d, np.float32)
    x0 = W.pop("emb")[rng.integers(0, vocab, T)]                              # the embedded tokens
    outs = {}
    cmp = None
    unavailable = ""
    dev = pyggml.Backend(device)
    cpu = pyggml.Backend("CPU")
    for name, be in (("device", dev), ("cpu", cpu)):
        with pyggml.Context(1 << 20, no_alloc=True) as ctx:
            x, inputs = _llama_block(pyggml, ctx, W, x0, T, d, H)
            g = pyggml.Graph(ctx)
            g.build_forward_expand(x)
            be.alloc_ctx_tensors(ctx)
            for t, a in inputs.items():
                t.set(a)
            be.graph_compute(g)
            outs[name] = x.get()
            if name == "cpu":
                # the graph in the CPU's buffers, ggml's copy in the device's: the guarded
                # proof (a ggml whose kernels pyggml has not reviewed) reads host memory
                try:
                    cmp = pyggml.compare_graph_backend(g, cpu, dev, tolerance=1e-5)
                except pyggml.errors.GGMLVersionError as e:     # an older ggml's signature
                    unavailable = str(e)
    nmse = pyggml.reference.nmse(outs["device"], outs["cpu"])
    c.details = {"shape": {"d": d, "heads": H, "tokens": T, "ffn": ff}, "out_nmse_vs_cpu": nmse}
    if cmp is None:
        c.details["compare_unavailable"] = unavailable
        c.verdict = "ok" if nmse < 1e-5 else "FAIL"
        c.summary = f"output NMSE vs CPU {nmse:.1e}; no node-by-node comparison: {unavailable}"
        return
    compared = [n for n in cmp["nodes"] if n["compared"]]
    worst = max(compared, key=lambda n: n["nmse"]) if compared else None
    first = cmp["first_diverging"]
    c.details.update({"nodes": len(cmp["nodes"]), "compared": len(compared),
                      "worst_node": worst, "first_diverging": first})
    c.verdict = "ok" if compared and first is None and nmse < 1e-5 else "FAIL"
    c.summary = (f"{len(compared)} of {len(cmp['nodes'])} nodes compared with the CPU, worst NMSE "
                 f"{worst['nmse']:.1e} ({worst['op']}); output NMSE vs CPU {nmse:.1e}"
                 + (f"; first diverging: {first['op']} {first['name']} ({first['nmse']:.1e})" if first else ""))


def _attention_f64(q, k, v, mask, scale):
    """float64 softmax attention, numpy layout: q (B,H,N,D), k/v (B,KVH,M,D), mask (N,M)."""
    B, H, N, D = q.shape
    KVH = k.shape[1]
    kk = np.repeat(k.astype(np.float64), H // KVH, axis=1)
    vv = np.repeat(v.astype(np.float64), H // KVH, axis=1)
    s = scale * q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) + mask.astype(np.float64)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ vv                                                         # (B, H, N, D)


def check_attention(c: Check, device: str, pyggml) -> None:
    from pyggml import Type
    rng = np.random.default_rng(1)
    dev = pyggml.Backend(device)
    cpu = pyggml.Backend("CPU")
    cases = []
    for D, N, M, H, KVH in ((64, 128, 256, 8, 2), (128, 64, 512, 8, 8), (128, 1, 1024, 16, 4)):
        q = rng.standard_normal((1, H, N, D)).astype(np.float32)
        k = rng.standard_normal((1, KVH, M, D)).astype(np.float16)
        v = rng.standard_normal((1, KVH, M, D)).astype(np.float16)
        # causal with the queries at the end of the keys (a decode step when N == 1)
        mask = np.where(np.arange(M)[None, :] > (M - N + np.arange(N))[:, None], -np.inf, 0).astype(np.float16)
        # rows padded to 64 (GGML_KQ_MASK_PAD, which ggml releases before 0.10 require); unread
        NP = -(-N // 64) * 64
        padded = np.zeros((NP, M), np.float16)
        padded[:N] = mask
        scale = D ** -0.5
        want = _attention_f64(q, k, v, mask, scale)
        got = {}
        for name, be in (("device", dev), ("cpu", cpu)):
            with pyggml.Context(1 << 20, no_alloc=True) as ctx:
                tq = ctx.new_tensor(Type.F32, (D, N, H, 1))
                tk = ctx.new_tensor(Type.F16, (D, M, KVH, 1))
                tv = ctx.new_tensor(Type.F16, (D, M, KVH, 1))
                tm = ctx.new_tensor(Type.F16, (M, NP, 1, 1))
                o = pyggml.flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)
                g = pyggml.Graph(ctx)
                g.build_forward_expand(o)
                if not be.supports_op(o):
                    got[name] = None
                    continue
                be.alloc_ctx_tensors(ctx)
                tq.set(q)
                tk.set(k)
                tv.set(v)
                tm.set(padded.reshape(1, 1, NP, M))
                be.graph_compute(g)
                got[name] = o.get().reshape(1, N, H, D).transpose(0, 2, 1, 3)    # [D,H,N,1] -> (B,H,N,D)
        row = {"D": D, "N": N, "M": M, "H": H, "KVH": KVH,
               "device_nmse_f64": None if got["device"] is None else pyggml.reference.nmse(got["device"], want),
               "cpu_nmse_f64": None if got["cpu"] is None else pyggml.reference.nmse(got["cpu"], want)}
        if got["device"] is not None and got["cpu"] is not None:
            row["device_nmse_cpu"] = pyggml.reference.nmse(got["device"], got["cpu"])
        cases.append(row)
    c.details = {"cases": cases}
    ran = [r for r in cases if r["device_nmse_f64"] is not None]
    # upstream test-backend-ops' own bound for FLASH_ATTN_EXT (its max_nmse_err): K/V in F16,
    # and Q rounded to F16 by the CPU's and CUDA's kernels
    c.verdict = "ok" if ran and all(r["device_nmse_f64"] < FA_NMSE for r in ran) else "FAIL"
    c.summary = (f"{len(ran)} of {len(cases)} shapes on {device}; NMSE vs float64 (bound {FA_NMSE:g}) "
                 + ", ".join(f"D{r['D']} N{r['N']}: {r['device_nmse_f64']:.1e} (CPU {r['cpu_nmse_f64']:.1e})"
                             for r in ran))


def _step(fn, c: Check) -> None:
    try:
        fn(c)
    except Exception as e:                          # a step's own failure is that step's FAIL
        c.verdict, c.summary = "FAIL", f"{type(e).__name__}: {e}"
        c.details["traceback"] = traceback.format_exc()


def _in_child(fn, c: Check, timeout: float) -> None:
    """A step that computes in this process (the Llama block, attention), in a forked child:
    a crash of the device's driver (seen: Mesa's lavapipe, on its own thread) or a hang is
    the step's FAIL, and the other steps and the report go on."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: the step, its outcome as JSON
        os.close(r)
        _step(fn, c)
        os.write(w, json.dumps({"verdict": c.verdict, "summary": c.summary, "details": c.details},
                               default=str).encode())
        os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    os.set_blocking(r, False)
    while True:
        try:
            chunk = os.read(r, 1 << 16)
        except BlockingIOError:
            chunk = None
        if chunk:
            chunks.append(chunk)
        elif chunk == b"":
            break
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        else:
            time.sleep(0.05)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    try:
        got = json.loads(b"".join(chunks))
        c.verdict, c.summary, c.details = got["verdict"], got["summary"], got["details"]
    except ValueError:
        how = (f"killed by signal {os.WTERMSIG(status)} ({signal.Signals(os.WTERMSIG(status)).name})"
               if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
        c.verdict, c.summary = "FAIL", (f"the step's process died: {how}" if time.monotonic() <= deadline
                                        else f"no result within {timeout:g} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="the device under test (default: CUDA0; CPU with --dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="the same steps with the CPU in place of the device")
    ap.add_argument("--out", default="gpu-check", help="folder for the JSON summary and the logs (default: gpu-check)")
    ap.add_argument("--jobs", type=int, default=usable_cores(), help="pytest and parity workers (default: every core)")
    ap.add_argument("--quick", action="store_true", help="the parity sweep's --quick (two cases per subject and type)")
    ap.add_argument("--only", default="", help="comma-separated steps to run (info,tests,parity,llama,attention)")
    ap.add_argument("--step-timeout", type=float, default=240.0, help="seconds for each subprocess step")
    ap.add_argument("--isolate-steps", action="store_true",
                    help="run the in-process steps (llama, attention) in a forked child each, so that a driver's "
                         "crash fails that step only (Vulkan on lavapipe; not for CUDA, which a fork after its "
                         "initialisation cannot use)")
    args = ap.parse_args(argv)
    device = args.device or ("CPU" if args.dry_run else "CUDA0")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}

    import pyggml
    import pyggml.reference  # noqa: F401  (nmse)

    steps = [("info", lambda c: check_info(c, device, pyggml)),
             ("tests", lambda c: check_tests(c, device, out, args.jobs, args.step_timeout)),
             ("parity", lambda c: check_parity(c, device, out, args.jobs, args.quick, args.step_timeout)),
             ("llama", lambda c: check_llama(c, device, pyggml)),
             ("attention", lambda c: check_attention(c, device, pyggml))]
    checks = []
    for name, fn in steps:
        c = Check(name)
        checks.append(c)
        if only and name not in only:
            c.summary = "not asked for (--only)"
            continue
        if name != "info" and checks[0].verdict == "FAIL":
            c.summary = "the device is not there"
            continue
        t0 = time.perf_counter()
        if args.isolate_steps and name in ("llama", "attention"):
            _in_child(fn, c, args.step_timeout)     # a crash of the driver's is that step's FAIL
        else:
            _step(fn, c)
        c.seconds = time.perf_counter() - t0
        print(f"[{name}] {c.verdict} ({c.seconds:.1f} s): {c.summary}", flush=True)

    width = max(len(c.name) for c in checks)
    print(f"\ngpu_check: {device}{' (dry run: the CPU in place of the device)' if args.dry_run else ''}")
    print(f"{'step'.ljust(width)}  verdict  seconds  summary")
    for c in checks:
        print(f"{c.name.ljust(width)}  {c.verdict.ljust(7)}  {c.seconds:7.1f}  {c.summary}")
    report = {"device": device, "dry_run": args.dry_run, "steps": [
        {"step": c.name, "verdict": c.verdict, "seconds": round(c.seconds, 2), "summary": c.summary,
         "details": c.details} for c in checks]}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"report: {out / 'gpu_check.json'}")
    return 1 if any(c.verdict == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
