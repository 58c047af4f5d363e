"""Write docs/upstream-defects-index.md from pyggml/defects.py: every known upstream ggml
defect, with where it is in upstream's code, the releases where it was measured, how to
reproduce it (its probe, the tests that show it, or the sanitizer), and what pyggml does
about it: one entry per record, ready to file, the ones still present in the newest
release measured first.

    python scripts/defects_doc.py            # write the file
    python scripts/defects_doc.py --check    # exit 1 if it is not what the records say

The records are the one source (the file is generated, and a test checks it is current);
the longer write-ups of some defects (docs/upstream-defect*.md) are linked from here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "upstream-defects-index.md"


def load_defects():
    """pyggml/defects.py, loaded from its file by the build's own loader (no build is needed)."""
    sys.path.insert(0, str(ROOT / "pyggml"))
    try:
        from _gen_ops import load_defects as load
    finally:
        sys.path.remove(str(ROOT / "pyggml"))
    return load()


def _write_ups(defect_id: str) -> list[str]:
    """the docs that write the defect up at length"""
    return sorted(p.name for p in (ROOT / "docs").glob("upstream-defect*.md")
                  if p.name != OUT.name
                  and (p.stem == f"upstream-defect-{defect_id}" or f"`{defect_id}`" in p.read_text()))


def _entry(d) -> list[str]:
    seen = ", ".join(d.seen_in) or "found at run time, on any release"
    if d.fixed_in:
        seen += f"; gone from {d.fixed_in}"
    out = [f"### `{d.id}`: {d.title}", ""]
    if d.ops:
        out.append(f"- **Ops:** {', '.join(d.ops)}")
    out += [f"- **Where:** {d.where}", f"- **Measured in:** {seen}"]
    how = []
    if d.probe:
        how.append(f"its probe, `python -c \"from pyggml import defects; print(defects.get('{d.id}').run_probe())\"` "
                   f"({d.probe_unit})")
    how += [f"`pytest {t}`" for t in d.shown_by]
    if d.ubsan:
        how.append("the sanitized build (`python scripts/sanitize.py`), which halts there without the "
                   f"suppression{'s' if len(d.ubsan) > 1 else ''} {', '.join(f'`{u}`' for u in d.ubsan)}")
    out.append(f"- **Reproduce:** {'; '.join(how) if how else 'no probe or test runs ggml on it yet (pyggml refuses it)'}")
    out.append(f"- **pyggml:** {d.action}")
    docs = _write_ups(d.id)
    if docs:
        out.append(f"- **Written up:** {', '.join(f'[{n}]({n})' for n in docs)}")
    return out + [""]


def render() -> str:
    mod = load_defects()
    measured = {r for d in mod.DEFECTS for r in d.seen_in}
    newest = max(measured, key=mod.release_key)
    present = [d for d in mod.DEFECTS if newest in d.seen_in and not d.fixed_in]
    fixed = [d for d in mod.DEFECTS if d.fixed_in]
    other = [d for d in mod.DEFECTS if d not in present and d not in fixed]
    out = ["# Known upstream ggml defects, one entry each",
           "",
           "Generated from `pyggml/defects.py` by `python scripts/defects_doc.py` (a test checks it is",
           "current): edit the records, not this file. \"Measured in\" lists the releases where a probe or a",
           "test that runs ggml's own code (pyggml's rules off, or ggml's autodiff) saw the defect.",
           "",
           f"{len(mod.DEFECTS)} records: {len(present)} measured in ggml {newest}, the newest release measured; "
           f"{len(fixed)} gone from a later release; {len(other)} not measured in {newest}.",
           ""]
    for title, group in ((f"## Present in ggml {newest}", present), ("## Fixed upstream", fixed),
                         (f"## Not measured in ggml {newest}", other)):
        if group:
            out += [title, ""]
            for d in group:
                out += _entry(d)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is not what pyggml/defects.py says: run python scripts/defects_doc.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
