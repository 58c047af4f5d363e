"""pyggml.parity.ulp: every F16/BF16 input and a dense F32 sweep of the elementwise ops,
in ULPs against correctly rounded results (the rounding, the ordering, the references
against mpmath, the bounds on the pinned ggml, a planted error, the command)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.parity import ulp

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _f16_grid() -> np.ndarray:
    """Every finite F16 value, the midpoints between neighbours and values just off them."""
    v = np.sort(np.unique(ulp.from_bits(ulp.all_values(Type.F16), Type.F16)))
    v = v[np.isfinite(v)]
    mid = (v[:-1] + v[1:]) / 2                      # exact in float64
    return np.concatenate([v, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf),
                           [65519.99, 65520.0, 65520.01, -65520.0, 1e6, -1e-30, 2.0 ** -25, 2.0 ** -26]])


def test_round_to_f16_and_f32_agree_with_numpys_conversions():
    """numpy converts float64 to float16 and float32 correctly rounded (ties to even,
    overflow to inf): an independent implementation of the same rounding."""
    x = _f16_grid()
    with np.errstate(over="ignore"):
        assert np.array_equal(ulp.round_to(x, Type.F16), x.astype(np.float16).astype(np.float64))
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.normal(0, 1, 20000) * 10.0 ** rng.integers(-45, 39, 20000),
                        np.float32(rng.normal(0, 1, 2000)).astype(np.float64) * (1 + 2.0 ** -24),   # ties
                        [3.4028235677973366e38, 3.402823669209385e38, 1.401298464324817e-45 / 2]])
    with np.errstate(over="ignore"):
        assert np.array_equal(ulp.round_to(y, Type.F32), y.astype(np.float32).astype(np.float64))


def test_round_to_bf16_picks_the_nearer_neighbour_and_the_even_one_on_a_tie():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, 50000) * 10.0 ** rng.integers(-41, 38, 50000)
    x = x[np.abs(x) < 3e38]
    r = ulp.round_to(x, Type.BF16)
    # the two BF16 values around x, found in the sorted list of every finite one
    bits = ulp.all_values(Type.BF16)
    v = ulp.from_bits(bits, Type.BF16)
    fin = np.isfinite(v) & ~((v == 0) & (bits != 0))                  # one zero
    order = np.argsort(v[fin], kind="stable")
    grid, grid_bits = v[fin][order], bits[fin][order]
    k = np.searchsorted(grid, x, side="right") - 1                       # grid[k] <= x < grid[k + 1]
    lo, hi = grid[k], grid[k + 1]
    dl, dh = x - lo, hi - x
    even_lo = grid_bits[k] % 2 == 0
    want = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(even_lo, lo, hi)))
    assert np.array_equal(r, want)
    # exact ties: 1 + 2^-8 lies between 1 and 1 + 2^-7 (odd): to 1; 1 + 3 * 2^-8 to 1 + 2^-6 (even)
    assert list(ulp.round_to(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]), Type.BF16)) == [1.0, 1 + 2.0 ** -6]
    big = float.fromhex("0x1.fep127")
    # half a unit (2^119) past the largest value: a tie, and its significand is odd: infinity
    assert list(ulp.round_to(np.array([big + 2.0 ** 119, big + 2.0 ** 118]), Type.BF16)) == [math.inf, big]


def test_ulp_distance_counts_the_values_between():
    b = ulp.all_values(Type.F16)
    pos = b[(b < 0x7C00)]                                   # +0 up to the largest finite F16
    assert set(np.diff(ulp.ordered(pos, Type.F16))) == {1}
    assert ulp.ulp_distance(np.uint16(0x0000), np.uint16(0x8000), Type.F16) == 0        # +0, -0
    assert ulp.ulp_distance(np.uint16(0x7BFF), np.uint16(0x7C00), Type.F16) == 1        # 65504, inf
    assert ulp.ulp_distance(np.uint16(0x0001), np.uint16(0x8001), Type.F16) == 2        # +-2^-24
    assert ulp.ulp_distance(np.uint32(0x3F800000), np.uint32(0x3F800003), Type.F32) == 3
    with pytest.raises(pyggml.GGMLError, match="F32 is not a 16-bit"):
        ulp.all_values(Type.F32)
    for f in (lambda: ulp.round_to(np.ones(2), Type.Q4_0), lambda: ulp.ordered(np.ones(2, np.uint16), Type.I32),
              lambda: ulp.measure("relu", Type.Q8_0), lambda: ulp.measure("mul_mat", Type.F32)):
        with pytest.raises(pyggml.GGMLError, match="ulp: "):
            f()


def _mp_exact(op: str, x: float):
    import mpmath as mp
    v = mp.mpf(x)
    sig = (lambda u: 1 / (1 + mp.exp(-u)))
    table = {
        "sqr": lambda: v * v, "sqrt": lambda: mp.sqrt(v), "log": lambda: mp.log(v), "sin": lambda: mp.sin(v),
        "cos": lambda: mp.cos(v), "expm1": lambda: mp.expm1(v), "softplus": lambda: mp.log1p(mp.exp(v)),
        "exp": lambda: mp.exp(v), "tanh": lambda: mp.tanh(v), "elu": lambda: v if v > 0 else mp.expm1(v),
        "sigmoid": lambda: sig(v), "silu": lambda: v * sig(v), "gelu_quick": lambda: v * sig(mp.mpf(1.702) * v),
        "gelu": lambda: v * sig(2 * mp.sqrt(2 / mp.pi) * (v + mp.mpf(0.044715) * v ** 3)),
        "gelu_erf": lambda: v * mp.erfc(-v / mp.sqrt(2)) / 2,
        "hardswish": lambda: v * min(max(v + 3, 0), 6) / 6, "hardsigmoid": lambda: min(max((v + 3) / 6, 0), 1),
    }
    return table[op]()


@pytest.mark.parametrize("t", [Type.F16, Type.BF16, Type.F32])
def test_the_references_round_as_mpmath_at_60_digits(t):
    """The float64 references, rounded to each type, give what mpmath's 60-digit results
    give: on a spread of every finite value of the type's range and each op's thresholds."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 60
    if t == Type.F32:
        bits = ulp.f32_inputs("", per_binade=4, around=2)
    else:
        bits = ulp.all_values(t)[::97]
    x0 = ulp.from_bits(bits, t)
    x0 = x0[np.isfinite(x0)]
    checked = 0
    for op in ("sqr", "sqrt", "log", "sin", "cos", "expm1", "softplus", "exp", "tanh", "elu", "sigmoid", "silu",
               "gelu_quick", "gelu", "gelu_erf", "hardswish", "hardsigmoid"):
        extra = ulp.from_bits(ulp.f32_inputs(op, per_binade=1, around=3), Type.F32)
        extra = ulp.round_to(extra[np.isfinite(extra)], t)
        x = np.concatenate([x0, extra[np.isfinite(extra)]])
        if op in ("sqrt", "log"):
            x = np.abs(x)
        if op in ("sin", "cos"):
            x = x[np.abs(x) < 1e12]                       # (mpmath's reduction at 60 digits needs |x| small)
        ours = ulp.round_to(ulp.exact(op, x), t)
        theirs = ulp.round_to(np.array([float(_mp_exact(op, float(v))) if not (op == "log" and v == 0)
                                        else -math.inf for v in x]), t)
        bad = np.flatnonzero(ours != theirs)
        assert bad.size == 0, f"{op} {t.name}: at x = {x[bad[:3]]} float64 {ours[bad[:3]]} mpmath {theirs[bad[:3]]}"
        checked += x.size
    assert checked > 15000


def test_every_elementwise_op_of_the_math_and_activation_families_has_a_reference():
    """Every one-input op of [math] and [activation] in the op table (not the _inplace
    variants, which run the same kernel; not the generic unary, which takes the enum) is swept."""
    text = (ROOT / "pyggml" / "ops.txt").read_text()
    fams = {}
    for name in ("math", "activation"):
        block = text.split(f"[{name}]")[1].split("\n[")[0]
        fams[name] = [ln.split("|")[0].strip() for ln in block.strip().splitlines() if "|" in ln]
    ops = {o for names in fams.values() for o in names if not o.endswith("_inplace") and o != "unary"}
    assert ops == set(ulp.REFERENCES), ops ^ set(ulp.REFERENCES)


def test_every_defect_a_bound_names_is_a_record():
    from pyggml import defects
    ids = {d.id for d in defects.DEFECTS}
    named = {b.defect for b in ulp.BOUNDS.values() if b.defect}
    assert named and named <= ids, named - ids
    for (op, _), b in ulp.BOUNDS.items():
        assert b.ulp <= 1 or b.why, (op, b)               # every bound over 1 ULP says why


def _linked_ops() -> set[str]:
    """The ops of REFERENCES the linked ggml has (a UNARY op where UnaryOp has its member)."""
    makes = {ln.split("|")[0].strip(): ln.split("|")[2].strip()
             for ln in (ROOT / "pyggml" / "ops.txt").read_text().splitlines() if ln.count("|") >= 4}
    return {op for op in ulp.REFERENCES
            if not makes[op].startswith("UNARY:") or hasattr(pyggml.UnaryOp, makes[op].split(":")[1])}


def test_every_op_is_within_its_bound_and_the_bounds_are_what_the_pin_measures():
    """On the pinned ggml each bound over 1 ULP is the measured maximum itself (so that a
    change of the kernels, better or worse, fails here and the table is measured again);
    on other releases each op must stay within it."""
    from sources import built_from_the_pin
    rows = ulp.sweep()
    assert {r.op for r in rows} == _linked_ops()
    assert sum(r.type == "F16" for r in rows) >= 20 and sum(r.type == "BF16" for r in rows) >= 15
    beyond = [(r.op, r.type, r.max_ulp, r.bound.ulp, r.nan_lost, r.nan_made) for r in rows if not r.within]
    if not built_from_the_pin():
        return          # other releases: the table is theirs to measure (pyggml parity ulp prints it)
    assert not beyond
    for r in rows:
        assert r.inputs == 65536 if r.type != "F32" else r.inputs > 30000
        if r.bound.ulp > 1:
            assert r.max_ulp == r.bound.ulp, (r.op, r.type, r.max_ulp, r.bound.ulp)
        if (r.op, r.type) in ulp.BOUNDS and r.bound.nan:         # a NaN reason given for one type: measured
            assert r.nan_lost or r.nan_made, (r.op, r.type)


def test_a_planted_error_is_measured_where_it_was_planted(monkeypatch):
    real = ulp.ggml_result

    def planted(op, bits, t):
        got, rt = real(op, bits, t)
        got = got.copy()
        i = int(np.flatnonzero(ulp.from_bits(bits, t) == 1.5)[0])
        right = ulp.to_bits(ulp.round_to(ulp.exact("tanh", np.array([1.5])), Type.F32), Type.F32)[0]
        got[i] = right + 3                           # three F32 values above the correctly rounded result
        j = int(np.flatnonzero(ulp.from_bits(bits, t) == -2.0)[0])
        got[j] = 0x7FC00000                          # a NaN where tanh(-2) is a number
        return got, rt

    monkeypatch.setattr(ulp, "ggml_result", planted)
    x = np.array([0.25, 1.5, -2.0, 3.0], np.float32)
    r = ulp.measure("tanh", Type.F32, x.view(np.uint32))
    assert (r.max_ulp, r.worst_x, r.over_1, r.nan_made, r.nan_lost, r.nan_example) == (3, 1.5, 1, 1, 0, -2.0)
    assert not r.within
    assert "BEYOND" in ulp.format_table([r])


def test_relu_sgn_step_hardsigmoid_and_leaky_relu_turn_nan_into_a_number():
    """Defect unary-nan-dropped: ggml's kernels test x > 0 (or clamp with fmaxf), so a NaN
    in gives 0 out (numpy and torch keep NaN); the ULP sweep counts them as NaN-."""
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7FA00000], np.uint32)      # quiet +-, signalling
    for op in ("relu", "sgn", "step", "hardsigmoid", "leaky_relu"):
        got, t = ulp.ggml_result(op, nans, Type.F32)
        assert list(ulp.from_bits(got, t)) == [0.0, 0.0, 0.0], op
        assert ulp.BOUNDS[(op, "*")].defect == "unary-nan-dropped"
    got, t = ulp.ggml_result("tanh", nans, Type.F32)        # what the others do: NaN stays
    assert np.isnan(ulp.from_bits(got, t)).all()


def _cli(*argv):
    # (from outside the source tree: the installed package)
    return subprocess.run([PY, "-m", "pyggml", "parity", "ulp", *argv], capture_output=True, text=True,
                          timeout=300, cwd="/")


def test_the_command_prints_the_table_and_writes_json_and_markdown(tmp_path):
    from sources import built_from_the_pin
    p = _cli("--op", "gelu*", "--op", "relu", "--types", "f16,F32", "--json", str(tmp_path / "u.json"),
             "--markdown", str(tmp_path / "u.md"))
    rows = json.loads((tmp_path / "u.json").read_text())["rows"]
    assert p.returncode == (0 if all(r["within"] for r in rows) else 1), p.stdout + p.stderr
    assert {(r["op"], r["type"]) for r in rows} <= {(o, t) for o in ("gelu", "gelu_erf", "gelu_quick", "relu")
                                                    for t in ("F16", "F32")}
    assert ("relu", "F32") in {(r["op"], r["type"]) for r in rows}
    assert re.search(r"^## relu$", (tmp_path / "u.md").read_text(), re.M)
    assert re.search(r"^relu +F32 +\d+ +0 ", p.stdout, re.M)
    relu = next(r for r in rows if (r["op"], r["type"]) == ("relu", "F32"))
    assert relu["nan_lost"] > 100 and relu["bound"]["defect"] == "unary-nan-dropped" and relu["nan_example"] == "nan"
    if built_from_the_pin():
        assert p.returncode == 0 and len(rows) == 8
        gelu = next(r for r in rows if (r["op"], r["type"]) == ("gelu", "F32"))
        assert gelu["max_ulp"] > 1000 and gelu["bound"]["why"] and gelu["within"]


def test_the_command_refuses_what_it_cannot_sweep(tmp_path):
    for argv, say in ((["--types", "Q4_0"], "Q4_0"), (["--op", "mul_mat"], "nothing matches mul_mat"),
                      (["--json", str(tmp_path / "no" / "u.json")], "--json")):
        p = _cli(*argv)
        assert p.returncode == 2 and say in p.stderr, (argv, p.stderr)


def test_the_docs_table_has_every_op():
    text = (ROOT / "docs" / "ulp.md").read_text()
    assert {m for m in re.findall(r"^## (\w+)$", text, re.M)} == set(ulp.REFERENCES)
