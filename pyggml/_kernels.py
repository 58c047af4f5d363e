"""Fingerprints of ggml's CPU kernels, per op: which upstream kernel source each of
pyggml's kernel rules was written against (a build input, run by CMake; not installed).

A kernel rule (csrc/rules_<family>.c) states the preconditions of one op's CPU kernel
as the pinned release has it. Against another tree, the kernel may differ: a rule can
then let through a node the kernel no longer handles (a crash, a hang). So the build
fingerprints each op's kernel in the tree it builds and compares it with the print the
rules were written against (``pyggml/kernels.txt``); an op whose print differs is not
trusted to its rule, and its nodes run through the fenced, forked proof.

An op's print is the sha256 of, in order:

* the blocks of ``ggml-cpu.c``'s switches that handle the op (``case GGML_OP_X:`` to
  its ``break;``): the dispatch to its kernel, its thread count and work size;
* every function that the dispatch calls, and every function those call in turn,
  defined in the op-level sources (``ggml-cpu.c``, ``ops.cpp``, ``unary-ops.cpp``,
  ``binary-ops.cpp``): the kernel, its type switches, asserts and loops. The vector
  and SIMD layers, quantization and the architecture folders are left out: they compute
  values, the op level decides what runs on what.

Comments and whitespace do not count, so a reformatting keeps the print; any other
change to any of that text changes it. Sub-ops (UNARY's, GLU's) share their op's print.

Only the standard library: CMake runs this inside pip's isolated build environment.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys

OP_LEVEL = ("ggml-cpu.c", "ops.cpp", "unary-ops.cpp", "binary-ops.cpp")
DISPATCH = "ggml-cpu.c"

_COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(")
_HEAD = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\s*)?(?:noexcept\s*)?$", re.S)
_CASE = re.compile(r"\bcase\s+GGML_OP_([A-Z0-9_]+)\s*:")
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "case", "do", "else"}


def strip(text: str) -> str:
    """The source without comments (string literals kept), whitespace collapsed."""
    text = _COMMENT.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else " ", text)
    return " ".join(text.split())


def functions(text: str) -> dict[str, str]:
    """name -> body text of each function defined at the top level of ``text`` (stripped
    source), bodies of overloads and template specialisations joined in file order."""
    out: dict[str, list[str]] = {}
    depth, start, head_from = 0, 0, 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            if depth == 0:
                start = i
                m = _HEAD.search(text[head_from:i])
                name = m.group(1) if m and m.group(1) not in _KEYWORDS else None
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if name:
                    out.setdefault(name, []).append(text[start:i + 1])
                head_from = i + 1
            elif depth < 0:               # unbalanced (a macro trick): start over at the top level
                depth, head_from = 0, i + 1
        elif c == ";" and depth == 0:
            head_from = i + 1
        i += 1
    return {k: "\n".join(v) for k, v in out.items()}


def case_blocks(text: str) -> dict[str, list[str]]:
    """op -> the text of each switch block of ``text`` that handles it: from its
    ``case GGML_OP_X:`` to the first ``break;`` after it."""
    out: dict[str, list[str]] = {}
    for m in _CASE.finditer(text):
        end = text.find("break;", m.end())
        out.setdefault(m.group(1), []).append(text[m.start(): end if end >= 0 else len(text)])
    return out


def fingerprints(src_cpu: str) -> dict[str, str]:
    """op (``ROPE``, ``UNARY``, ...) -> the sha256 of its kernel's text, for the
    ggml-cpu source folder ``src_cpu`` (a tree's ``src/ggml-cpu``)."""
    texts = {}
    for name in OP_LEVEL:
        path = os.path.join(src_cpu, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts[name] = strip(f.read())
    if DISPATCH not in texts:
        raise FileNotFoundError(f"{src_cpu} has no {DISPATCH}")
    defs: dict[str, str] = {}
    for name in OP_LEVEL:
        for fn, body in functions(texts.get(name, "")).items():
            defs[fn] = defs.get(fn, "") + body
    blocks = case_blocks(texts[DISPATCH])
    blocks.pop("COUNT", None)             # GGML_OP_COUNT: a switch's guard, not an op
    prints = {}
    for op, blks in sorted(blocks.items()):
        h = hashlib.sha256()
        for b in blks:
            h.update(b.encode())
        seen: set[str] = set()
        todo = [c for b in blks for c in _CALL.findall(b) if c in defs]
        while todo:                       # the closure of the calls, in a fixed order
            fn = todo.pop(0)
            if fn in seen:
                continue
            seen.add(fn)
            h.update(f"\n{fn}\n".encode())
            h.update(defs[fn].encode())
            todo.extend(c for c in _CALL.findall(defs[fn]) if c in defs and c not in seen)
        prints[op] = h.hexdigest()
    return prints


def read_prints(path: str) -> dict[str, str]:
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                op, digest = line.split()
                out[op] = digest
    return out


def changed(expected: dict[str, str], got: dict[str, str]) -> list[str]:
    """The ops whose kernel print in ``got`` is not the one the rules were written against
    (new ops too: no rule was written against them)."""
    return sorted(op for op in set(expected) | set(got) if expected.get(op) != got.get(op))


def gen_header(changed_ops: list[str] | None, tree: str) -> str:
    """pyggml_kernels.h: which ops' kernels differ from those the rules were written
    against (``changed_ops``; None: no kernel source to compare, the kernels unknown)."""
    lines = ["/* Generated by pyggml/_kernels.py: do not edit. */", "#pragma once", ""]
    if changed_ops is None:
        lines += ["/* no kernel source of the linked ggml: its kernels are unknown */",
                  "#define PG_KERNELS_KNOWN 0", "#define PG_KERNELS_CHANGED NULL"]
    else:
        names = ", ".join(f'"{op}"' for op in changed_ops)
        lines += [f"/* the kernels of {tree} against pyggml/kernels.txt */", "#define PG_KERNELS_KNOWN 1",
                  f"#define PG_KERNELS_CHANGED {names}{', ' if names else ''}NULL"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", help="the ggml tree being built (the folder with src/ggml-cpu); none: unknown")
    ap.add_argument("--expected", required=True, help="pyggml/kernels.txt")
    ap.add_argument("--out", help="write pyggml_kernels.h here")
    ap.add_argument("--write", action="store_true",
                    help="write the tree's prints to --expected (for the pinned release, after a rule review)")
    args = ap.parse_args(argv)
    got = fingerprints(os.path.join(args.tree, "src", "ggml-cpu")) if args.tree else None
    if args.write:
        if got is None:
            ap.error("--write needs --tree")
        with open(args.expected, "w") as f:
            f.write("# The CPU kernels pyggml's rules were written against: one sha256 per op, made by\n"
                    "# pyggml/_kernels.py from ggml's source (see its docstring). Rewrite with\n"
                    "#   python pyggml/_kernels.py --tree vendor/ggml --expected pyggml/kernels.txt --write\n"
                    "# only after checking each changed op's rule against its new kernel.\n")
            f.writelines(f"{op} {d}\n" for op, d in sorted(got.items()))
        return 0
    diff = None if got is None else changed(read_prints(args.expected), got)
    if args.out:
        text = gen_header(diff, args.tree or "")
        old = open(args.out).read() if os.path.exists(args.out) else None
        if old != text:
            with open(args.out, "w") as f:
                f.write(text)
    what = ("no kernel source: the kernels are unknown" if diff is None else
            f"{len(diff)} op kernels differ from those of the rules" + (f": {' '.join(diff)}" if diff else ""))
    print(f"_kernels: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
