"""Command line: ``pyggml demo | info | parity`` (also ``python -m pyggml ...``)."""

from __future__ import annotations

import argparse
import json
import os
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
    from pyggml._machine import cpu_model, usable_cores

    ops = coverage.op_coverage()
    builders = coverage.builder_coverage()
    print(json.dumps({
        "pyggml": pyggml.__version__,
        **pyggml.build_info(),
        "ops_wrapped": len(ops["wrapped"]),
        "ops_not_wrapped": ops["not_wrapped"],
        "builders_bound": len(builders["bound"]),
        "known_defects": {d["id"]: d["title"] for d in defects.known_defects()},
        "machine": {"cpu": cpu_model(), "usable_cores": usable_cores()},
    }, indent=2))
    return 0


def _version() -> str:
    try:
        import pyggml
        return f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()})"
    except ImportError as e:             # the source tree, or a broken install: say which
        return f"pyggml (not importable: {e})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pyggml", description="pyggml command line")
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("demo", help="build and compute a small graph, print the result")
    sub.add_parser("info", help="print how this pyggml was built (ggml version, source, flags)")
    from pyggml.parity import cli as parity_cli
    par = sub.add_parser("parity", help="check ops (and attention gradients) along independent paths",
                         description=parity_cli.__doc__)
    parity_cli.add_arguments(par)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "parity":
            return parity_cli.main(args, par)
        return {"demo": demo, "info": info}[args.cmd]()
    except BrokenPipeError:
        # the reader went away (pyggml demo | head -1): end quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
