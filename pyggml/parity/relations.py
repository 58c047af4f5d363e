"""Metamorphic relations: two ggml computations that must agree whatever the reference says.

*Batch*: an op that treats the items of a batch independently gives, on a batch, what
it gives on each item alone (then stacked). Three of ggml's recorded defects break this
relation (``conv-1d-batch-layout``, ``conv-transpose-2d-batch``, FLASH_ATTN_BACK's
``fab-batch-gqa-oob``), and a float64 reference catches them only when a sample has a
batch. Here every sample of an op in ``BATCH`` gets one: where its batched tensors hold
one item, two more items (its own values, shuffled) are stacked onto it; where they hold
several, they are split. The sweep's ``batched`` path computes the whole batch in one
graph, ``per-item`` each item in its own graph, and the two must agree bit for bit (the
same kernel over the same rows).

``BATCH`` says, per op, which ggml dimension of each tensor argument is the batch
(``None``: the argument is shared by every item, e.g. a convolution's kernel) and which
dimension of the result. An argument whose batch dimension is 1 is broadcast over the
batch and passed whole to every item.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

import pyggml
from pyggml.opinfo import Arg, OpInfo, Sample

__all__ = ["BATCH", "BROADCAST", "JOINED", "NOT_BITWISE_ACROSS_LAYOUTS", "NOT_BITWISE_ACROSS_THREADS",
           "NOT_BITWISE_IN_PLACE", "QUANT_DIFFERS", "THREADS", "as_four", "batch_pair", "contiguous",
           "contiguous_tolerance", "inplace_tolerance", "inplace_twin", "other_threads", "quant_tolerance",
           "repeated", "stack_results", "threads_tolerance"]

# *Threads*: ggml's CPU kernels split a node's rows (or blocks) over its threads; each result
# element is computed by one thread, in the same order whatever their count, so the result
# is the same bits on 1 thread and on THREADS (an odd count: uneven splits). The ``threads``
# path computes the sample on THREADS threads (on 1 where the sweep runs on more) and is
# compared with ``ggml`` exactly, but for the ops of NOT_BITWISE_ACROSS_THREADS (why, and
# the NMSE bound that holds instead). The same bound holds the batch relation of those ops
# where the sweep runs on more than one thread: a batch can change the split (a single query
# row takes flash_attn_ext's split-KV path, a batch of them does not).
THREADS = 3
NOT_BITWISE_ACROSS_THREADS: dict[str, tuple[float, str]] = {
    "cross_entropy_loss": (1e-12, "each thread sums its rows' losses and thread 0 adds the threads' sums "
                                  "(ops.cpp ggml_compute_forward_cross_entropy_loss_f32): the order follows the count "
                                  "(NMSE 1.3e-14 between 1 and 3 threads on 7 rows)"),
    "flash_attn_ext": (1e-10, "one query row and 512 keys or more (the split-KV path, ops.cpp): the keys are split "
                              "into one chunk per thread and the chunks' softmax partials merged, so the chunk "
                              "bounds follow the count (NMSE 4.2e-13 between 1 and 3 threads on 512 keys)"),
}


# *Layout*: a sample whose tensors are views (transposed, permuted, strided) gives what the
# same values give as contiguous tensors. The ``contiguous`` path computes that and is
# compared with ``ggml``: bit for bit, but for the ops of NOT_BITWISE_ACROSS_LAYOUTS.
NOT_BITWISE_ACROSS_LAYOUTS: dict[str, tuple[float, str]] = {
    "norm": (1e-12, "rows whose elements are not adjacent (nb[0] != 4: a transposed tensor) take the kernel's "
                    "scalar loop, contiguous ones ggml_vec_sum_f32 and ggml_vec_cvar_f32 (ops.cpp "
                    "ggml_compute_forward_norm_f32): another order of the sums (NMSE 5.5e-15 on 4 rows of 5)"),
}


def contiguous(sample: Sample) -> Sample | None:
    """The sample with every tensor argument contiguous (the same values), or None where
    they all are already."""
    if not any(isinstance(a, Arg) and a.layout != "contiguous" for a in sample.args):
        return None
    args = tuple(dataclasses.replace(a, layout="contiguous", perm=(0, 1, 2, 3)) if isinstance(a, Arg) else a
                 for a in sample.args)
    return Sample(args, f"{sample.name}, contiguous")       # (a defect of the views may not be one of these)


def contiguous_tolerance(op: str) -> float:
    return NOT_BITWISE_ACROSS_LAYOUTS.get(op, (0.0, ""))[0]


# ops whose in-place kernel rounds otherwise than the out-of-place one on releases before
# the one named: {op: (NMSE bound, why, the first release measured bit for bit)}
NOT_BITWISE_IN_PLACE: dict[str, tuple[float, str, str]] = {
    op: (1e-12, "libggml-python 0.9.4's normal-mode (mode 0) ROPE kernel rounds otherwise in place: 1 ULP "
                "apart (NMSE 6e-16), both within 2e-15 of float64; 0.17.0's and later are the same bits", "0.17.0")
    for op in ("rope", "rope_ext", "rope_custom", "rope_multi")
}


def inplace_tolerance(op: str) -> float:
    import pyggml
    from pyggml.defects import release_key
    tol, _, since = NOT_BITWISE_IN_PLACE.get(op, (0.0, "", ""))
    return tol if since and release_key(pyggml.ggml_version()) < release_key(since) else 0.0


def inplace_twin(op: str) -> str:
    """The name of op's in-place variant in the registry ("" where it has none): the
    ``inplace`` path computes the sample with it, compared with ``ggml`` bit for bit."""
    from pyggml.opinfo import registry
    twin = f"{op}_inplace"
    return twin if not op.endswith("_inplace") and twin in registry() else ""


# *Broadcast*: an operand that ggml broadcasts (mul_mat's a over b's dims 2 and 3; attention's
# k and v over q's heads: GQA) gives what it gives repeated to full size, head h taking
# the broadcast operand's h // (its factor), as ggml maps them. The ``repeated`` path computes
# the sample with those operands repeated (np.repeat), compared with ``ggml`` bit for bit.
# op -> [(the broadcast argument, the argument whose sizes it is repeated to, ggml dims)]
BROADCAST: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {
    "mul_mat": [(0, 1, (2, 3))],
    "flash_attn_ext": [(1, 0, (2,)), (2, 0, (2,))],
}


def repeated(op: str, sample: Sample) -> Sample | None:
    """The sample with each broadcast operand of ``op`` repeated to its full size, or None
    where none is broadcast (or the op has none)."""
    args = list(sample.args)
    changed = False
    for i, j, dims in BROADCAST.get(op, []):
        a, full = args[i], sample.args[j]
        if not isinstance(a, Arg) or not isinstance(full, Arg):
            continue
        v, target = np.asarray(a.value), np.asarray(full.value)
        for d in dims:
            n, m = _size(v, d), _size(target, d)
            if n == m or m % n:
                continue
            if v.ndim <= d:
                v = v.reshape((1,) * (d + 1 - v.ndim) + v.shape)
            v = np.repeat(v, m // n, axis=_axis(v, d))
            changed = True
        args[i] = _with_value(a, v)
    return Sample(tuple(args), f"{sample.name}, broadcast operands repeated") if changed else None


# *Quantization*: for each quantized type, the subject ``quant:TYPE`` quantizes seeded rows
# three ways, compared by their dequantized values: ``quantize`` (ggml_quantize_chunk, what
# model converters call), ``cpy`` (a graph's F32 -> TYPE copy: the CPU backend's from_float)
# and ``requantize`` (ggml_quantize_chunk of quantize's own dequantized values: a value
# already on the type's grid should come back as itself). Each is compared with ``quantize``
# exactly, but where the table below says why not (and the NMSE that holds instead).
QUANT_DIFFERS: dict[tuple[str, str], tuple[float, str]] = {
    ("cpy", "IQ4_NL"): (2e-2, "ggml_quantize_chunk searches 7 scales per block (quantize_iq4_nl: "
                              "quantize_row_iq4_nl_impl(..., ntry 7)), a graph's from_float none "
                              "(quantize_row_iq4_nl_ref: ntry -1): 16% of the bytes differ (NMSE up to 4.3e-3)"),
}
_NOT_IDEMPOTENT = ("{t}'s quantizer searches its scales heuristically ({f}): values already on the grid of one "
                   "choice of scales need not lead back to it (NMSE up to {worst:.1e} on the sweep's rows)")
# type, its search, the worst NMSE measured over the sweep's three cases (ggml 0.25.3, seed 0);
# each bound is five times that
for _t, _f, _worst in (("Q2_K", "make_qkx2_quants", 1.5e-2), ("Q3_K", "make_q3_quants", 3.6e-3),
                       ("Q4_K", "make_qkx2_quants", 1.2e-4), ("Q5_K", "make_qkx2_quants", 8.7e-5),
                       ("Q6_K", "make_qx_quants", 1.6e-5), ("IQ2_XXS", "the iq2 grid search", 3.5e-3),
                       ("IQ2_XS", "the iq2 grid search", 6.1e-3), ("IQ2_S", "the iq2 grid search", 5.9e-3),
                       ("IQ3_XXS", "the iq3 grid search", 1.9e-3), ("IQ3_S", "the iq3 grid search", 1.1e-3),
                       ("IQ1_S", "the iq1 grid search", 1.2e-2), ("IQ1_M", "the iq1 grid search", 1.1e-2),
                       ("IQ4_NL", "quantize_row_iq4_nl_impl", 3.1e-4), ("IQ4_XS", "quantize_row_iq4_nl_impl", 9.0e-4)):
    QUANT_DIFFERS[("requantize", _t)] = (5 * _worst, _NOT_IDEMPOTENT.format(t=_t, f=_f, worst=_worst))


def quant_tolerance(path: str, type_name: str) -> float:
    return QUANT_DIFFERS.get((path, type_name), (0.0, ""))[0]


def other_threads(n_threads: int) -> int:
    return THREADS if n_threads == 1 else 1


def threads_tolerance(op: str, type_name: str) -> float:
    return NOT_BITWISE_ACROSS_THREADS.get(op, (0.0, ""))[0]

JOINED = 3          # the items of a batch made from a one-item sample: it, and two shuffles of it

def _stack_fab(results: list[np.ndarray], items: list[Sample]) -> np.ndarray:
    """FLASH_ATTN_BACK's result packs grad_q, grad_k and grad_v (each padded to 16 bytes):
    the batch's is each gradient's items one after the other (ne3 is the outermost), packed."""
    parts: list[list[np.ndarray]] = [[], [], []]
    for r, one in zip(results, items):
        flat, at = np.asarray(r).reshape(-1), 0
        for j in range(3):
            n = np.asarray(one.args[j].value).size
            parts[j].append(flat[at:at + n])
            at += n + (-n % 4)
    out = [np.concatenate(p) for p in parts]
    return as_four(np.concatenate([np.pad(p, (0, -p.size % 4)) for p in out]))


# op -> (the batch's ggml dimension in each positional argument, None where it is shared;
#        the batch's ggml dimension in the result, or how to stack the items' results)
Stack = Callable[[list[np.ndarray], list[Sample]], np.ndarray]
BATCH: dict[str, tuple[tuple[int | None, ...], int | Stack]] = {
    # the convolutions: the kernel is shared, the data's last dimension is the batch
    "conv_1d": ((None, 2), 2),                  # b [L, IC, N] -> [OL, OC, N]
    "conv_1d_ph": ((None, 2), 2),
    "conv_2d": ((None, 3), 3),                  # b [W, H, IC, N] -> [OW, OH, OC, N]
    "conv_2d_dw": ((None, 3), 3),
    "conv_transpose_2d_p0": ((None, 3), 3),
    "pool_2d": ((3,), 3),                       # [W, H, C, N]
    # matrices, normalisations, attention: dimension 3 (a broadcast operand has 1 there)
    "mul_mat": ((3, 3), 3),
    "soft_max_ext": ((3, 3), 3),                # a, mask
    "norm": ((3,), 3),
    "rms_norm": ((3,), 3),
    "rope": ((3, None), 3),                     # positions are per token, shared by the batch
    "flash_attn_ext": ((3, 3, 3, 3), 3),        # q, k, v, mask -> [D, H, N, B]
    "add": ((3, 3), 3),
    "mul": ((3, 3), 3),
    "flash_attn_back": ((3, 3, 3, 3), _stack_fab),   # q, k, v, d: one packed result
}


def _axis(arr: np.ndarray, dim: int) -> int | None:
    """The numpy axis of ggml dimension ``dim`` of an array in numpy order (None: the
    array has fewer dimensions, so its size there is 1)."""
    return arr.ndim - 1 - dim if dim < arr.ndim else None


def _size(arr: np.ndarray, dim: int) -> int:
    ax = _axis(arr, dim)
    return 1 if ax is None else arr.shape[ax]


def _with_value(a: Arg, v: np.ndarray) -> Arg:
    return dataclasses.replace(a, value=v)


def _shuffled(v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(v.reshape(-1)).reshape(v.shape)


def batch_pair(info: OpInfo, sample: Sample, seed: int) -> tuple[Sample, list[Sample]] | str:
    """(the whole batch as one sample, its items as samples) for ``sample`` of ``info``'s op,
    or why the relation does not apply to it (a string)."""
    spec = BATCH.get(info.op)
    if spec is None:
        return f"{info.op} has no batch dimension declared (pyggml.parity.relations.BATCH)"
    dims, _ = spec
    batched: list[tuple[int, Arg, int]] = [(i, a, d) for i, (a, d) in enumerate(zip(sample.args, dims))
                                           if isinstance(a, Arg) and d is not None]
    if not batched:
        return "no argument of this sample is batched"
    if any(isinstance(a, pyggml.Tensor) for a in sample.args):
        return "the sample passes a ready tensor of a context pool"
    sizes = {_size(np.asarray(a.value), d) for _, a, d in batched} - {1}
    if len(sizes) > 1:
        return f"the batched arguments hold batches of {sorted(sizes)} (broadcast by a factor): not split"
    rng = np.random.default_rng([seed, 0xBA7C])
    args = list(sample.args)
    if not sizes:                           # one item: stack two shuffles of it onto it
        n = JOINED
        for i, a, d in batched:
            v = np.asarray(a.value)
            if v.ndim <= d:
                v = v.reshape((1,) * (d + 1 - v.ndim) + v.shape)
            parts = [v] + [_shuffled(v, rng) for _ in range(n - 1)]
            args[i] = _with_value(a, np.concatenate(parts, axis=_axis(v, d)))
        whole = Sample(tuple(args), f"{sample.name}, {n} items stacked")
    else:
        n = sizes.pop()
        whole = sample
    items = []
    for k in range(n):
        one = list(whole.args)
        for i, a, d in batched:
            v = np.asarray(whole.args[i].value)
            if _size(v, d) == n:
                one[i] = _with_value(a, np.take(v, [k], axis=_axis(v, d)))
        items.append(Sample(tuple(one), f"{whole.name}, item {k}"))
    return whole, items


def stack_results(op: str, results: list[np.ndarray], items: list[Sample]) -> np.ndarray:
    """The items' results stacked along the result's batch dimension, as a 4-d array in
    numpy order (the batch's result, as ``as_four`` gives it)."""
    dim = BATCH[op][1]
    if callable(dim):
        return dim(results, items)
    four = [np.asarray(r).reshape((1,) * (4 - np.ndim(r)) + np.shape(r)) for r in results]
    return np.concatenate(four, axis=3 - dim)


def as_four(arr: Any) -> np.ndarray:
    a = np.asarray(arr)
    return a.reshape((1,) * (4 - a.ndim) + a.shape)
