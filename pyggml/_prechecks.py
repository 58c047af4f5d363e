"""Bespoke checks of graph builders whose defect no kernel rule can see, because it lies
in how the builder composes other ops (pyggml/ops.txt: the ``check=NAME`` flag). The
generated wrapper calls ``NAME(op, *args)`` with the converted arguments, in C order,
before the builder runs. Like the kernel rules, they are off within
``pyggml.opinfo.harness.rules_disabled()`` (to show what they prevent)."""

from __future__ import annotations

from pyggml import _core
from pyggml.errors import UpstreamDefect


def conv_1d_batch(op: str, a, b, *params) -> None:
    """ggml_conv_1d reshapes mul_mat's [OL, N, OC] product to [OL, OC, N] without
    permuting it: with a batch (b.ne[2] > 1) the values come out scrambled."""
    if b.ne[2] > 1 and _core._rules_enabled():
        raise UpstreamDefect(f"{op}: a batch of {b.ne[2]} (b.ne[2] > 1): ggml_conv_1d reshapes the [OL, N, OC] "
                             f"product to [OL, OC, N] without permuting it, so the values come out scrambled; "
                             f"convolve each batch on its own (or use conv_1d_dw / conv_2d with a height of 1)",
                             "conv-1d-batch-layout")
