"""Command line: ``pyggml demo | info | parity`` (also ``python -m pyggml ...``)."""

from __future__ import annotations

import argparse
import json
import sys


def demo() -> int:
    import numpy as np

    import pyggml

    # C:  ctx = ggml_init(...); a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2); ...
    with pyggml.Context(16 * 1024 * 1024) as ctx:
        a = ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32))   # ne = (3, 2)
        b = ctx.from_numpy(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))
        c = pyggml.soft_max(ctx, pyggml.add(ctx, pyggml.scale(ctx, a, 0.5), b))
        graph = pyggml.Graph(ctx)
        graph.build_forward_expand(c)
        graph.compute(n_threads=2)
        print(f"pyggml {pyggml.__version__} on ggml {pyggml.ggml_version()}")
        print("graph:", " -> ".join(n.op for n in graph.nodes))
        print("softmax(0.5 * a + b) =")
        print(c.numpy())
        result = c.numpy()
    print("row sums:", result.sum(axis=1))
    return 0


def info() -> int:
    import pyggml
    from pyggml import coverage, defects

    ops = coverage.op_coverage()
    builders = coverage.builder_coverage()
    print(json.dumps({
        "pyggml": pyggml.__version__,
        **pyggml.build_info(),
        "ops_wrapped": len(ops["wrapped"]),
        "ops_not_wrapped": ops["not_wrapped"],
        "builders_bound": len(builders["bound"]),
        "known_defects": {d["id"]: d["title"] for d in defects.known_defects()},
    }, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pyggml", description="pyggml command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("demo", help="build and compute a small graph, print the result")
    sub.add_parser("info", help="print how this pyggml was built (ggml version, source, flags)")
    par = sub.add_parser("parity", help="compare attention gradients along independent paths")
    par.add_argument("--quick", action="store_true", help="a subset of the sweep (seconds, not minutes)")
    par.add_argument("--json", metavar="PATH", help="write the comparisons as JSON")
    par.add_argument("--junit", metavar="PATH", help="write the comparisons as JUnit XML")
    par.add_argument("--threads", type=int, default=None, help="CPU threads for ggml and torch")
    par.add_argument("--no-torch", action="store_true", help="leave torch out even if importable")
    par.add_argument("--paths", help="comma-separated subset of kernel,autodiff,reference,torch")
    args = ap.parse_args(argv)
    if args.cmd == "parity":
        from pyggml import parity

        return parity.main(quick=args.quick, json_path=args.json, junit_path=args.junit,
                           n_threads=args.threads, no_torch=args.no_torch,
                           paths=args.paths.split(",") if args.paths else None)
    return {"demo": demo, "info": info}[args.cmd]()


if __name__ == "__main__":
    sys.exit(main())
