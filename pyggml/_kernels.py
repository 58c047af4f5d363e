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
from collections.abc import Mapping

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


def kernel_texts(src_cpu: str) -> dict[str, list[tuple[str, str]]]:
    """op -> what its print is made of, in order, for the ggml-cpu source folder
    ``src_cpu``: ("case", block) for each dispatch block, then (function, body) for each
    function the dispatch reaches (the closure of the calls, breadth first)."""
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
    out = {}
    for op, blks in sorted(blocks.items()):
        parts = [("case", b) for b in blks]
        seen: set[str] = set()
        todo = [c for b in blks for c in _CALL.findall(b) if c in defs]
        while todo:                       # the closure of the calls, in a fixed order
            fn = todo.pop(0)
            if fn in seen:
                continue
            seen.add(fn)
            parts.append((fn, defs[fn]))
            todo.extend(c for c in _CALL.findall(defs[fn]) if c in defs and c not in seen)
        out[op] = parts
    return out


def fingerprints(src_cpu: str) -> dict[str, str]:
    """op (``ROPE``, ``UNARY``, ...) -> the sha256 of its kernel's text, for the
    ggml-cpu source folder ``src_cpu`` (a tree's ``src/ggml-cpu``)."""
    prints = {}
    for op, parts in kernel_texts(src_cpu).items():
        h = hashlib.sha256()
        for name, text in parts:
            h.update(text.encode() if name == "case" else f"\n{name}\n".encode() + text.encode())
        prints[op] = h.hexdigest()
    return prints


def kernel_diff(op: str, old_cpu: str, new_cpu: str) -> str:
    """A unified diff of what ``op``'s print is made of between two ggml-cpu folders, one
    statement per line: what a rule review of a changed kernel reads."""
    import difflib

    def lines(src_cpu: str) -> list[str]:
        out = []
        for name, text in kernel_texts(src_cpu).get(op, []):
            out.append(f"==== {name}")
            out += [ln.strip() + "\n" for ln in re.sub(r"([;{}])", r"\1\n", text).splitlines() if ln.strip()]
        return [ln if ln.endswith("\n") else ln + "\n" for ln in out]
    return "".join(difflib.unified_diff(lines(old_cpu), lines(new_cpu), f"{op} ({old_cpu})", f"{op} ({new_cpu})",
                                        n=2))


def read_prints(path: str) -> dict[str, str]:
    """op -> the print of the pinned release's kernel (the lines without a release)."""
    return {op: digest for op, digest, release in _lines(path) if not release}


def read_accepted(path: str) -> dict[str, set[str]]:
    """op -> every print its rule holds for: the pinned release's, and each print of
    another release's kernel that a rule review accepted (``OP DIGEST RELEASE``)."""
    out: dict[str, set[str]] = {}
    for op, digest, _ in _lines(path):
        out.setdefault(op, set()).add(digest)
    return out


def _lines(path: str) -> list[tuple[str, str, str]]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith(PINNED_KEY + " "):
                op, digest, *release = line.split()
                out.append((op, digest, release[0] if release else ""))
    return out


PINNED_KEY = "pinned"       # the line `pinned X.Y.Z`: the release the unlabelled prints are from


def read_pinned_release(path: str) -> str:
    """The release the pinned prints (the lines without a release) were made from: the
    file's `pinned X.Y.Z` line; "" where it has none."""
    with open(path) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if len(words) == 2 and words[0] == PINNED_KEY:
                release_number(words[1])
                return words[1]
    return ""


def changed(expected: Mapping[str, str | set[str]], got: dict[str, str]) -> list[str]:
    """The ops whose kernel print in ``got`` is not one the rules were written against or
    reviewed for (``expected``: op -> a print, or a set of them; new ops too: no rule was
    written against them)."""
    def holds(op: str) -> bool:
        want, have = expected.get(op), got.get(op)
        return have is not None and want is not None and (have == want if isinstance(want, str) else have in want)
    return sorted(op for op in set(expected) | set(got) if not holds(op))


def review(path: str, ops: list[str], got: dict[str, str], release: str) -> list[str]:
    """Record that each of ``ops``' rules holds for its kernel in ``got`` (a tree of
    ``release``), after reading ``--diff``: appends ``OP DIGEST RELEASE`` lines to the
    prints file. Returns the lines added (none for a print already there)."""
    release_number(release)     # a release the rules' PG_RELEASE can name
    accepted = read_accepted(path)
    added = []
    for op in ops:
        if op not in got:
            raise KeyError(f"{op}: no such op in the tree")
        if got[op] not in accepted.get(op, set()):
            added.append(f"{op} {got[op]} {release}\n")
    with open(path, "a") as f:
        f.writelines(added)
    return added


def reviewed(pinned: dict[str, str], accepted: Mapping[str, set[str]], got: dict[str, str]) -> list[str]:
    """The ops whose kernel in ``got`` is trusted by a review of another release's print,
    not the pinned one: trusted to their rules, yet not the kernels the pinned release has
    (a rule that knows a changed kernel's own defect still applies it there)."""
    return sorted(op for op, d in got.items() if d != pinned.get(op) and d in accepted.get(op, set()))


def review_releases(path: str) -> dict[tuple[str, str], str]:
    """(op, print) -> the release a review accepted that print for (``OP DIGEST RELEASE``)."""
    return {(op, digest): release for op, digest, release in _lines(path) if release}


def release_number(release: str) -> int:
    """"0.25.3" -> 25003: the number C's PG_RELEASE(0, 25, 3) makes (preconditions.h)."""
    parts = [int(x) for x in re.findall(r"\d+", release)[:3]]
    if not parts:
        raise ValueError(f"{release!r}: not a release such as 0.25.3")
    major, minor, patch = (parts + [0, 0])[:3]
    return major * 1_000_000 + minor * 1000 + patch


def gen_header(changed_ops: list[str] | None, tree: str, reviewed_ops: Mapping[str, str] = {},
               pinned_release: str = "") -> str:
    """pyggml_kernels.h: which ops' kernels differ from those the rules were written
    against (``changed_ops``; None: no kernel source to compare, the kernels unknown), and
    which are trusted by a review of another release (``reviewed_ops``: op -> that release);
    with the release of the pinned prints, every trusted kernel has a release, which the
    rules' clauses for a range of releases compare (pg_kernel_since, pg_kernel_before)."""
    lines = ["/* Generated by pyggml/_kernels.py: do not edit. */", "#pragma once", ""]
    pinned = release_number(pinned_release) if pinned_release else 0
    lines.append(f"#define PG_KERNELS_PINNED_RELEASE {pinned}   /* {pinned_release or 'unknown'} */")
    if changed_ops is None:
        lines += ["/* no kernel source of the linked ggml: its kernels are unknown */",
                  "#define PG_KERNELS_KNOWN 0", "#define PG_KERNELS_CHANGED NULL", "#define PG_KERNELS_REVIEWED NULL",
                  "#define PG_KERNELS_REVIEWED_IN 0"]
    else:
        def names(ops):
            return "".join(f'"{op}", ' for op in ops)
        ops = sorted(reviewed_ops)
        lines += [f"/* the kernels of {tree} against pyggml/kernels.txt */", "#define PG_KERNELS_KNOWN 1",
                  f"#define PG_KERNELS_CHANGED {names(changed_ops)}NULL",
                  f"#define PG_KERNELS_REVIEWED {names(ops)}NULL",
                  "/* the release each reviewed kernel is from (PG_RELEASE), in the same order */",
                  f"#define PG_KERNELS_REVIEWED_IN {''.join(f'{release_number(reviewed_ops[op])}, ' for op in ops)}0"]
    return "\n".join(lines) + "\n"


def rewrite(path: str, got: dict[str, str], release: str) -> None:
    """Make ``got`` (the prints of a tree of ``release``) the pinned prints of the file at
    ``path``. The reviews stay, with their comments, except a line whose print is now the
    pinned one; where the pin moves to another release, the old pinned prints that differ
    become ``OP DIGEST OLD`` lines: the rules were written against them, and a build of
    that release trusts them still."""
    release_number(release)
    old_release = read_pinned_release(path) if os.path.exists(path) else ""
    kept: list[str] = []
    old_pinned: dict[str, str] = {}
    if os.path.exists(path):
        seen_pin = False
        with open(path) as f:
            for raw in f:
                words = raw.split("#", 1)[0].split()
                if len(words) == 2 and words[0] == PINNED_KEY:
                    seen_pin = True
                elif len(words) == 2:
                    old_pinned[words[0]] = words[1]
                elif len(words) == 3:
                    if got.get(words[0]) != words[1]:
                        kept.append(raw)
                elif seen_pin:         # comments (the header's are rewritten)
                    kept.append(raw)
    moved = []
    if old_release and old_release != release:
        moved = [f"# The kernels of {old_release}, pinned before {release}: the rules were written against them.\n"]
        moved += [f"{op} {d} {old_release}\n" for op, d in sorted(old_pinned.items()) if got.get(op) != d]
    with open(path, "w") as f:
        f.write(HEADER)
        f.write(f"{PINNED_KEY} {release}\n")
        f.writelines(f"{op} {d}\n" for op, d in sorted(got.items()))
        f.writelines(moved if len(moved) > 1 else [])
        f.writelines(kept)


HEADER = ("# The CPU kernels pyggml's rules hold for: one sha256 per op, made by\n"
          "# pyggml/_kernels.py from ggml's source (see its docstring), of the release the\n"
          "# `pinned` line names (vendor/ggml.lock's). Rewrite with\n"
          "#   python pyggml/_kernels.py --tree vendor/ggml --expected pyggml/kernels.txt --write --release X.Y.Z\n"
          "# only after checking each changed op's rule against its new kernel. A line\n"
          "# `OP DIGEST RELEASE` is a kernel of another release whose diff (--diff) a rule review\n"
          "# read and found the rule still right for (--review): that op is trusted there too.\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", help="the ggml tree being built (the folder with src/ggml-cpu); none: unknown")
    ap.add_argument("--expected", required=True, help="pyggml/kernels.txt")
    ap.add_argument("--out", help="write pyggml_kernels.h here")
    ap.add_argument("--write", action="store_true",
                    help="write the tree's prints to --expected (for the pinned release, after a rule review)")
    ap.add_argument("--diff", nargs="+", metavar="OP",
                    help="print what changed in these ops' kernels from the --against tree to --tree")
    ap.add_argument("--against", help="the tree the rules were written against (for --diff; vendor/ggml)")
    ap.add_argument("--review", nargs="+", metavar="OP",
                    help="record that these ops' rules hold for their kernels in --tree, a tree of --release")
    ap.add_argument("--release", help="the ggml release of --tree (for --review and --write)")
    args = ap.parse_args(argv)
    got = fingerprints(os.path.join(args.tree, "src", "ggml-cpu")) if args.tree else None
    if args.diff:
        if got is None or not args.against:
            ap.error("--diff needs --tree and --against")
        for op in args.diff:
            sys.stdout.write(kernel_diff(op, os.path.join(args.against, "src", "ggml-cpu"),
                                         os.path.join(args.tree, "src", "ggml-cpu")) or f"{op}: no change\n")
        return 0
    if args.review:
        if got is None or not args.release:
            ap.error("--review needs --tree and --release")
        for line in review(args.expected, args.review, got, args.release):
            print(f"_kernels: reviewed {line.strip()}")
        return 0
    if args.write:
        if got is None or not args.release:
            ap.error("--write needs --tree and --release")
        rewrite(args.expected, got, args.release)
        return 0
    accepted = read_accepted(args.expected)
    diff = None if got is None else changed(accepted, got)
    if args.out:
        releases = review_releases(args.expected)
        again = {} if got is None else {op: releases[op, got[op]]
                                        for op in reviewed(read_prints(args.expected), accepted, got)}
        text = gen_header(diff, args.tree or "", again, read_pinned_release(args.expected))
        old = open(args.out).read() if os.path.exists(args.out) else None
        if old != text:
            with open(args.out, "w") as f:
                f.write(text)
    what = ("no kernel source: the kernels are unknown" if diff is None else
            f"{len(diff)} op kernels differ from those of the rules" + (f": {' '.join(diff)}" if diff else "")
            + ("" if got is None else "; reviewed for another release: "
               + (" ".join(reviewed(read_prints(args.expected), accepted, got)) or "none")))
    print(f"_kernels: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
