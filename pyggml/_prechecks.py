"""Bespoke checks of graph builders whose defect no kernel rule can see, because it lies
in how the builder composes other ops, and the shape contract of the one builder pyggml
writes itself (pyggml/ops.txt: the ``check=NAME`` flag). The
generated wrapper calls ``NAME(op, *args)`` with the converted arguments, in C order,
before the builder runs. Like the kernel rules, they are off within
``pyggml.opinfo.harness.rules_disabled()`` (to show what they prevent)."""

from __future__ import annotations

from pyggml import _core
from pyggml.errors import ArgumentError, UpstreamDefect


def conv_1d_batch(op: str, a, b, *params) -> None:
    """ggml_conv_1d reshapes mul_mat's [OL, N, OC] product to [OL, OC, N] without
    permuting it: with a batch (b.ne[2] > 1) the values come out scrambled."""
    if b.ne[2] > 1 and _core._rules_enabled():
        raise UpstreamDefect(f"{op}: a batch of {b.ne[2]} (b.ne[2] > 1): ggml_conv_1d reshapes the [OL, N, OC] "
                             f"product to [OL, OC, N] without permuting it, so the values come out scrambled; "
                             f"convolve each batch on its own (or use conv_1d_dw / conv_2d with a height of 1)",
                             "conv-1d-batch-layout")


def flash_attn_back_shapes(op: str, q, k, v, d, masked) -> None:
    """The seed builder's shape contract (csrc/fab_node.c asserts it too), with the
    dimension that disagrees named: q [D,N,ne2,ne3], k [D,M,kvne2,ne3], v [M,D,kvne2,ne3],
    d [D,N,ne2,ne3], ne2 a multiple of kvne2. Types, emptiness and M >= N are the
    kernel's, checked by the FLASH_ATTN_BACK rule on the node. Always on: the builder
    would abort without it."""
    (D, N, ne2, ne3), M, kvne2 = q.ne, k.ne[1], k.ne[2]
    if k.ne[0] != D:
        raise ArgumentError(f"{op}: k.ne[0]={k.ne[0]} must equal q.ne[0]=D={D}")
    if kvne2 == 0 or ne2 % kvne2 != 0:
        raise ArgumentError(f"{op}: q.ne[2]=ne2={ne2} must be a multiple of k.ne[2]=kvne2={kvne2}")
    if k.ne[3] != ne3:
        raise ArgumentError(f"{op}: k.ne[3]={k.ne[3]} must equal q.ne[3]=ne3={ne3}")
    checks = (("v.ne[0]", v.ne[0], "M", M), ("v.ne[1]", v.ne[1], "D", D),
              ("d.ne[0]", d.ne[0], "D", D), ("d.ne[1]", d.ne[1], "N", N),
              ("v.ne[2]", v.ne[2], "kvne2", kvne2), ("v.ne[3]", v.ne[3], "ne3", ne3),
              ("d.ne[2]", d.ne[2], "ne2", ne2), ("d.ne[3]", d.ne[3], "ne3", ne3))
    for name, got, want_name, want in checks:
        if got != want:
            raise ArgumentError(f"{op}: {name}={got} must equal {want_name}={want} "
                                f"(q [D,N,ne2,ne3]={q.ne}, k [D,M,kvne2,ne3]={k.ne}, "
                                f"v [M,D,kvne2,ne3]={v.ne}, d [D,N,ne2,ne3]={d.ne})")
