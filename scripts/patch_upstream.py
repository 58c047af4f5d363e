#!/usr/bin/env python3
"""Apply pyggml's fixes for two upstream defects of FLASH_ATTN_BACK to a ggml source tree.

The fixes are targeted edits of the few expressions involved (docs/upstream-defects.md
says what each defect is and why the edit fixes it); no upstream file is copied:

``fab-batch-gqa-oob``
    In the CPU kernel (src/ggml-cpu/ops.cpp), the batch strides of the k and v
    gradients multiply by q's head count where the k and v head counts belong: with
    grouped-query attention and a batch > 1 the kernel writes past its result.
``fab-work-size``
    In the CPU backend's graph plan (src/ggml-cpu/ggml-cpu.c), the work buffer of a
    FLASH_ATTN_BACK node leaves out the cache-line gap the kernel puts between each
    thread's rows: with tiny heads and several threads it reads and writes past it.

Each edit must match exactly once in the tree (or be there already): a tree whose code
moved on fails loudly instead of being patched wrongly.

Run: ``python scripts/patch_upstream.py PATH/TO/ggml [--fix ID ...] [--check]``
(``--check``: report which fixes are applied, change nothing). ``scripts/ci_upstream.py``
uses it for the ``patched:`` specs.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edit:
    file: str            # relative to the ggml tree (the folder with src/ and include/)
    before: str          # a regular expression matching the expression as upstream has it
    after: str           # the replacement (re.sub syntax)
    fixed: str           # a regular expression matching the fixed expression


# the k and v gradients' batch strides: the last factor is the head count of k (v), not of q
_STRIDE = r"nb0\s*\*\s*ne{t}0\s*\*\s*ne{t}1\s*\*\s*ne{h}2"

FIXES: dict[str, tuple[Edit, ...]] = {
    "fab-batch-gqa-oob": (
        Edit("src/ggml-cpu/ops.cpp", _STRIDE.format(t="k", h="q"), "nb0*nek0*nek1*nek2", _STRIDE.format(t="k", h="k")),
        Edit("src/ggml-cpu/ops.cpp", _STRIDE.format(t="v", h="q"), "nb0*nev0*nev1*nev2", _STRIDE.format(t="v", h="v")),
    ),
    # the plan's per-thread span for S and SM: the kernel's rows are (max(D, Mup) + a
    # cache line) floats apart, the plan counted max(D, Mup)
    "fab-work-size": (
        Edit("src/ggml-cpu/ggml-cpu.c", r"MAX\(\s*D\s*,\s*ne11\s*\)\s*\*\s*2\s*;",
             "(MAX(D, ne11) + (int64_t) CACHE_LINE_SIZE_F32) * 2;",
             r"\(MAX\(\s*D\s*,\s*ne11\s*\)\s*\+\s*\(int64_t\)\s*CACHE_LINE_SIZE_F32\s*\)\s*\*\s*2\s*;"),
    ),
}


def _tree(path: Path) -> Path:
    """The ggml tree: PATH itself, or PATH/ggml (an sdist's or a llama.cpp checkout's)."""
    for p in (path, path / "ggml"):
        if (p / "src" / "ggml-cpu").is_dir() and (p / "include" / "ggml.h").is_file():
            return p
    raise SystemExit(f"patch_upstream: {path} is not a ggml source tree (no src/ggml-cpu, include/ggml.h)")


def status(path: Path, fixes: list[str] | None = None) -> dict[str, str]:
    """Per fix: "applied", "not applied", or why it cannot be (an edit matches 0 or 2+ times)."""
    root = _tree(path)
    out = {}
    for fid in fixes or list(FIXES):
        states = []
        for e in FIXES[fid]:
            text = (root / e.file).read_text()
            n_before, n_fixed = len(re.findall(e.before, text)), len(re.findall(e.fixed, text))
            if n_fixed == 1 and n_before == 0:
                states.append("applied")
            elif n_before == 1 and n_fixed == 0:
                states.append("not applied")
            else:
                states.append(f"cannot apply: {e.file} has {n_before} matches of the defect's expression and "
                              f"{n_fixed} of the fix's (expected one of either)")
        bad = [s for s in states if s.startswith("cannot")]
        out[fid] = bad[0] if bad else ("applied" if set(states) == {"applied"} else
                                       "not applied" if set(states) == {"not applied"} else "partly applied")
    return out


def apply(path: Path, fixes: list[str] | None = None) -> dict[str, str]:
    """Apply the fixes (all by default) to the tree at ``path``; returns the status after.
    Raises SystemExit, changing nothing, when an edit cannot be placed exactly."""
    root = _tree(path)
    fixes = fixes or list(FIXES)
    before = status(root, fixes)
    bad = {f: s for f, s in before.items() if s.startswith("cannot") or s == "partly applied"}
    if bad:
        raise SystemExit("patch_upstream: " + "; ".join(f"{f}: {s}" for f, s in bad.items()))
    edits: dict[str, str] = {}
    for fid in fixes:
        if before[fid] == "applied":
            continue
        for e in FIXES[fid]:
            text = edits.get(e.file, (root / e.file).read_text())
            edits[e.file] = re.sub(e.before, e.after, text, count=1)
    for rel, text in edits.items():
        (root / rel).write_text(text)
    stamp = root / ".pyggml-source"          # where scripts/vendor_ggml.py says the tree came from
    if edits and stamp.is_file():
        done = [f for f in fixes if before[f] != "applied"]
        stamp.write_text(stamp.read_text().rstrip("\n") + f"; patched by scripts/patch_upstream.py: {', '.join(done)}\n")
    return status(root, fixes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path, help="a ggml source tree (or a folder holding ggml/)")
    ap.add_argument("--fix", action="append", choices=sorted(FIXES), help="a fix to apply (repeatable; default: all)")
    ap.add_argument("--check", action="store_true", help="report which fixes are applied; change nothing")
    args = ap.parse_args(argv)
    result = status(args.tree, args.fix) if args.check else apply(args.tree, args.fix)
    for fid, s in result.items():
        print(f"{fid}: {s}")
    return 0 if all(s in ("applied", "not applied") for s in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
