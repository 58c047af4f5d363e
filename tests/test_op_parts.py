"""One family name gives every part of an op, and a missing part fails here.

A family of the op table (``[F]`` in pyggml/ops.txt) owns four files: its kernel rules
``pyggml/csrc/rules_F.c``, its OpInfos ``pyggml/opinfo/F.py``, its rule tests
``tests/test_rules_F.py`` (and its rows). :func:`missing_parts` lists what breaks that:
a row without its OpInfo, an OpInfo in another family's module, an op a row makes with no
rule or with its rule in a family that does not make it, a rule no row needs, a rule
stated twice, a family file without a family. The rule tables are read from the C
runtime itself (``_core.rule_entries``: what the build compiled), not from source text.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import pyggml.opinfo
from pyggml import _core, _optable

ROOT = Path(__file__).resolve().parents[1]
# ops whose rule no bound row needs: NONE is the op of a leaf (new_tensor, from_numpy);
# CUSTOM, of the nodes pyggml builds itself on ggml's custom-op mechanism (the blocked
# attention backward of pyggml.attention; the [custom] rows are not bound)
RULES_WITHOUT_ROWS = {"NONE", "CUSTOM"}


def opinfo_families() -> dict[str, str]:
    """{op: the family module of pyggml.opinfo that defines its OpInfo}"""
    out = {}
    for mod in pkgutil.iter_modules(pyggml.opinfo.__path__):
        if mod.name.startswith("_") or mod.name == "harness":
            continue
        for info in importlib.import_module(f"pyggml.opinfo.{mod.name}").OPINFOS:
            out[info.op] = mod.name
    return out


def family_files() -> dict[str, set[str]]:
    """{kind: the family names its files carry} for the three kinds of family file"""
    return {
        "rules": {p.stem[len("rules_"):] for p in (ROOT / "pyggml" / "csrc").glob("rules_*.c")},
        "opinfo": {m.name for m in pkgutil.iter_modules(pyggml.opinfo.__path__)
                   if not m.name.startswith("_") and m.name != "harness"},
        "tests": {p.stem[len("test_rules_"):] for p in (ROOT / "tests").glob("test_rules_*.py")},
    }


def missing_parts(rows, opinfos: dict[str, str], rules: list[tuple[str, str]],
                  files: dict[str, set[str]]) -> list[str]:
    """Every way the rows, OpInfos, rule entries and family files disagree (empty: none)."""
    problems = []
    bound = [r for r in rows if "unbound" not in r["flags"]]
    families = {r["family"] for r in rows}
    makers: dict[str, set[str]] = {}
    for r in bound:
        if not r["makes"].endswith(":*"):        # unary(), glu(): the op is an argument
            makers.setdefault(r["makes"], set()).add(r["family"])
    rule_family: dict[str, str] = {}
    for fam, op in rules:
        if op in rule_family:
            problems.append(f"{op}: two rules, in rules_{rule_family[op]}.c and rules_{fam}.c")
        rule_family[op] = fam
    for r in bound:
        name, fam = r["name"], r["family"]
        if name not in opinfos:
            problems.append(f"{name} [{fam}]: no OpInfo (pyggml/opinfo/{fam}.py)")
        elif opinfos[name] != fam:
            problems.append(f"{name} [{fam}]: its OpInfo is in pyggml/opinfo/{opinfos[name]}.py, "
                            f"not {fam}.py")
    for op, fams in sorted(makers.items()):
        if op not in rule_family:
            problems.append(f"{op} (made by [{', '.join(sorted(fams))}]): no kernel rule")
        elif rule_family[op] not in fams:
            problems.append(f"{op}: its rule is in rules_{rule_family[op]}.c, but only "
                            f"[{', '.join(sorted(fams))}] make it")
    for op, fam in rule_family.items():
        if op not in makers and op not in RULES_WITHOUT_ROWS:
            problems.append(f"{op}: rules_{fam}.c has a rule for it, but no bound row makes it")
    with_rows = {r["family"] for r in bound}
    for kind, names in files.items():
        for f in sorted(names - families):
            problems.append(f"{kind} file of family {f!r}: ops.txt has no [{f}]")
        need = families if kind == "rules" else with_rows
        for f in sorted(need - names):
            problems.append(f"[{f}] has no {kind} file")
    return problems


def _real():
    return list(_optable.OPS), opinfo_families(), _core.rule_entries(), family_files()


def test_every_part_of_every_op_is_in_its_familys_file():
    assert missing_parts(*_real()) == []


def test_the_rule_tables_cover_every_family():
    # the build compiled a table for each rules_<family>.c, and every family has entries
    rows, _, rules, files = _real()
    assert {f for f, _ in rules} == files["rules"] == {r["family"] for r in rows}


def test_every_rule_reaches_its_op_of_the_linked_ggml():
    # a table entry whose name the linked ggml spells otherwise would be dropped silently
    # (the op table spans releases: an op this ggml lacks has no slot, and needs none)
    ops, unary, glu = _core.linked_op_names()
    reached = 0
    for _, name in _core.rule_entries():
        kind, _, sub = name.rpartition(":")
        names = {"": ops, "UNARY": unary, "GLU": glu}[kind]
        if sub in names:
            op = ops.index(kind) if kind else names.index(sub)
            assert _core.op_is_checked(op, names.index(sub) if kind else 0), name
            reached += 1
    assert reached > 100


# --- the check fails on what it is for -------------------------------------------------------

def _without(seq, pred):
    return [x for x in seq if not pred(x)]


def test_a_removed_opinfo_fails():
    rows, opinfos, rules, files = _real()
    del opinfos["mul_mat"]
    assert missing_parts(rows, opinfos, rules, files) == ["mul_mat [matmul]: no OpInfo (pyggml/opinfo/matmul.py)"]


def test_an_opinfo_in_another_familys_module_fails():
    rows, opinfos, rules, files = _real()
    opinfos["sqr"] = "arith"
    assert missing_parts(rows, opinfos, rules, files) == [
        "sqr [math]: its OpInfo is in pyggml/opinfo/arith.py, not math.py"]


def test_a_removed_rule_fails():
    rows, opinfos, rules, files = _real()
    rules = _without(rules, lambda e: e[1] == "SOFT_MAX")
    assert missing_parts(rows, opinfos, rules, files) == ["SOFT_MAX (made by [attention]): no kernel rule"]


def test_a_rule_in_a_family_that_does_not_make_the_op_fails():
    rows, opinfos, rules, files = _real()
    rules = [("conv" if op == "MUL_MAT" else fam, op) for fam, op in rules]
    assert missing_parts(rows, opinfos, rules, files) == [
        "MUL_MAT: its rule is in rules_conv.c, but only [matmul] make it"]


def test_a_rule_stated_twice_or_for_no_row_fails():
    rows, opinfos, rules, files = _real()
    rules = rules + [("arith", "ADD"), ("math", "UNARY:NO_SUCH_OP")]
    assert missing_parts(rows, opinfos, rules, files) == [
        "ADD: two rules, in rules_arith.c and rules_arith.c",
        "UNARY:NO_SUCH_OP: rules_math.c has a rule for it, but no bound row makes it"]


@pytest.mark.parametrize("kind", ["rules", "opinfo", "tests"])
def test_a_missing_or_stray_family_file_fails(kind):
    rows, opinfos, rules, files = _real()
    files[kind] = (files[kind] - {"norm"}) | {"core"}
    assert missing_parts(rows, opinfos, rules, files) == [
        f"{kind} file of family 'core': ops.txt has no [core]", f"[norm] has no {kind} file"]
