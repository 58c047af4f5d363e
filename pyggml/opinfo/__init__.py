"""The op-information registry: for every graph builder pyggml binds, how to test it.

One :class:`OpInfo` per builder of the op table (``pyggml/ops.txt``), written in
ggml's conventions: a seeded sample generator (shapes in numpy order, broadcasting,
permuted and transposed inputs, odd and unit dimensions, empty tensors where ggml
allows them), an independent float64 NumPy reference of ggml's semantics, the types
to run, a tolerance per type (NMSE, the metric of ggml's test-backend-ops), and
whether ggml has a backward for the op (then the test suite checks ggml's autodiff
against central differences of the reference).

The registry is split by the families of the op table: ``pyggml/opinfo/<family>.py``
defines ``OPINFOS``, a list of OpInfo. :func:`registry` collects them all.
:mod:`pyggml.opinfo.harness` runs a sample through ggml and compares.

Writing one::

    OpInfo("add", ref=lambda a, b: a + b,            # numpy broadcasting == ggml's repeat here
           samples=binary_samples, types=(Type.F32, Type.F16, Type.BF16), grad=True)
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Iterable

import numpy as np

from pyggml._core import Type

__all__ = ["Arg", "OpInfo", "Sample", "TOL", "registry"]

# test-backend-ops' default NMSE bound; looser defaults where the result type itself
# rounds (an F16 result cannot be closer to float64 than F16's own rounding)
TOL = {Type.F32: 1e-7, Type.F16: 1e-6, Type.BF16: 5e-5}


@dataclasses.dataclass(frozen=True)
class Arg:
    """A tensor argument of a sample.

    ``value``: its elements in numpy order (``shape`` = ``ne`` reversed), float64 for
    float types, integers for I32 and friends. ``type``: the ggml type it is stored
    in (F16/BF16/quantized values are rounded on the way in, and the reference sees
    the rounded values). ``layout``: how the tensor is made:

    * ``"contiguous"``: from_numpy;
    * ``"transposed"``: a contiguous tensor of the transposed values, then ggml_transpose
      (the two fastest dims swapped back: rows not contiguous);
    * ``"permuted"``: a contiguous tensor permuted by ``perm`` (ggml axes: source dim i
      becomes dim perm[i]) into this value's shape;
    * ``"strided"``: a view of a larger tensor whose rows are twice as long (rows
      contiguous, dims 1.. strided).
    ``param``: mark it as a parameter (gradient check; contiguous only).
    """
    value: np.ndarray
    type: Type = Type.F32
    layout: str = "contiguous"
    perm: tuple[int, int, int, int] = (0, 1, 2, 3)
    param: bool = True


@dataclasses.dataclass(frozen=True)
class Sample:
    """One call of the builder: ``args`` in C order after ctx (Arg for a tensor, None
    for NULL, plain values for scalars, enums and int arrays).

    ``defect`` / ``grad_defect``: the id of a known upstream defect (pyggml.defects)
    that this sample's forward / backward pass hits; the tests then expect pyggml to
    refuse it with UpstreamDefect of that id, instead of comparing values."""
    args: tuple[Any, ...]
    name: str = ""
    defect: str = ""
    grad_defect: str = ""


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """How to test one graph builder (``op``: its name in the op table).

    ``ref(*args)`` gets each Arg as a float64 (or integer) ndarray of the values as
    stored, other arguments as given, and returns the expected result (numpy order)
    as float64 or int. ``samples(rng, type)`` yields Samples for each type of
    ``types``. ``tol`` overrides the NMSE bound per type (``TOL`` otherwise); ``exact``
    compares integer results for equality. ``grad``: ggml has a backward for this op:
    the gradient of ``sum(result * c)`` (random c) with respect to each ``param`` Arg
    is checked against central differences of ``ref``, to NMSE ``grad_tol``.
    ``note`` says why a tolerance is looser than the default, or what is not covered.
    ``typed_ref``: ``ref`` also takes ``types=``, the ggml types of the sample's tensor
    args in order (for a reference that reads byte offsets or strides).
    ``unsampled``: types the kernel rule accepts that no sample holds, each with why
    (tests/test_opinfo.py: every type the rule accepts is in ``types`` or here).
    ``canon``: what of the result ggml promises, where it promises less than every bit of
    it: every path's result and the reference are compared after it (top_k: each row's
    indices sorted, since ggml leaves their order unspecified).
    """
    op: str
    ref: Callable[..., Any]
    samples: Callable[[np.random.Generator, Type], Iterable[Sample]]
    types: tuple[Type, ...] = (Type.F32,)
    tol: dict[Type, float] = dataclasses.field(default_factory=dict)
    exact: bool = False
    grad: bool = False
    grad_tol: float = 1e-6
    note: str = ""
    typed_ref: bool = False
    unsampled: dict[Type, str] = dataclasses.field(default_factory=dict)
    canon: Callable[[np.ndarray], np.ndarray] | None = None

    def tolerance(self, t: Type) -> float:
        return self.tol.get(t, TOL.get(t, 1e-7))


_REGISTRY: dict[str, OpInfo] | None = None


def registry() -> dict[str, OpInfo]:
    """Every OpInfo of every family module of pyggml.opinfo, by op name."""
    global _REGISTRY
    if _REGISTRY is None:
        found: dict[str, OpInfo] = {}
        for mod in pkgutil.iter_modules(__path__):
            if mod.name.startswith("_") or mod.name == "harness":
                continue
            for info in importlib.import_module(f"{__name__}.{mod.name}").OPINFOS:
                if info.op in found:
                    raise ValueError(f"two OpInfos for {info.op}")
                found[info.op] = info
        _REGISTRY = found
    return _REGISTRY
