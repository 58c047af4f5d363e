#!/usr/bin/env python3
"""Whether ``pyggml parity diff`` gives the same verdicts from files that keep large
outputs as digests (``--save``, format 3) as from files that keep every output
(``--save-whole``), on two real builds.

Save one sweep of each build both ways, then::

    python scripts/check_saved_digests.py A-whole.npz A.npz B-whole.npz B.npz

It diffs A against B in the four combinations, takes the whole-whole diff as the truth,
and prints per combination: verdicts (bitwise, beyond tolerance, closer, undecided) that
differ from the truth, the outputs compared through digests, whether each one's true
NMSE and max abs lie within the bounds diff gave, and how far above the true NMSE the
upper bound is (median and largest ratio). Exit status 1 when any verdict differs or a
bound does not hold."""

from __future__ import annotations

import argparse
import statistics
import sys

from pyggml.parity import store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("a_whole", "a", "b_whole", "b"):
        ap.add_argument(name)
    args = ap.parse_args(argv)
    files = {"A": {"whole": args.a_whole, "digests": args.a}, "B": {"whole": args.b_whole, "digests": args.b}}
    truth = {(d.case, d.path): d for d in store.diff(files["A"]["whole"], files["B"]["whole"])[2]}

    def verdict(d: store.Difference) -> tuple[bool, bool, str, bool]:
        return d.bitwise, d.beyond, d.closer, d.undecided

    print(f"truth (whole A, whole B): {len(truth)} outputs compared, {sum(not d.bitwise for d in truth.values())} "
          f"differ, {sum(d.beyond for d in truth.values())} beyond tolerance")
    bad = 0
    for fa in ("whole", "digests"):
        for fb in ("whole", "digests"):
            if fa == fb == "whole":
                continue
            got = {(d.case, d.path): d for d in store.diff(files["A"][fa], files["B"][fb])[2]}
            missing = set(truth) ^ set(got)
            wrong = [k for k in set(truth) & set(got) if verdict(truth[k]) != verdict(got[k])]
            bounded = [k for k in set(truth) & set(got) if not got[k].exact]
            outside = [k for k in bounded if not (got[k].nmse_low <= truth[k].nmse <= got[k].nmse
                                                  and truth[k].max_abs <= got[k].max_abs)]
            ratios = [got[k].nmse / truth[k].nmse for k in bounded if truth[k].nmse > 0]
            spread = (f"upper bound / true NMSE: median {statistics.median(ratios):.3g}, largest {max(ratios):.3g}"
                      if ratios else "no differing output compared through digests")
            print(f"A {fa:7s} B {fb:7s}: {len(wrong)} verdicts differ, {len(missing)} outputs not in both, "
                  f"{len(bounded)} compared through digests, {len(outside)} outside their bounds; {spread}")
            for k in sorted(wrong)[:10]:
                print(f"  {k[0]} {k[1]}: whole {verdict(truth[k])}, here {verdict(got[k])}")
            bad += len(wrong) + len(missing) + len(outside)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
