"""OpInfos of the [train] family: cross_entropy_loss, opt_step_adamw, opt_step_sgd.

The opt_step builders update their parameter ``a`` in place (the result is a view of
it) and need ``a`` flagged as a parameter (``ggml_set_param``), which an :class:`Arg`
cannot say. Their samples therefore pass ``a`` as a ready Tensor, made by
:func:`param_tensor` in a context of this module; the reference reads the values ``a``
had when the sample was made, and puts them back (the compute changed them), so a
sample can run again.
"""

from __future__ import annotations

import numpy as np

import pyggml
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import normal, uniform

_PARAM_CTX: list = []                 # the context param_tensor allocates in (a new one when full)
_PARAMS: dict[int, tuple] = {}        # id(tensor) -> (tensor, its values when made)


def param_tensor(values: np.ndarray) -> pyggml.Tensor:
    """An F32 tensor of ``values`` flagged as a parameter, kept alive by this module."""
    values = np.ascontiguousarray(values, np.float32)
    for attempt in range(2):
        if not _PARAM_CTX or attempt:
            _PARAM_CTX.append(pyggml.Context(4 << 20))
        try:
            t = _PARAM_CTX[-1].from_numpy(values)
            break
        except pyggml.ContextFullError:
            if attempt:
                raise
    pyggml.set_param(t)
    _PARAMS[id(t)] = (t, values.copy())
    return t


def _restore(t) -> np.ndarray:
    """The values a param_tensor was made with, as float64; its data reset to them."""
    _, values = _PARAMS[id(t)]
    t.numpy()[...] = values
    return values.astype(np.float64)


def reset(sample: Sample) -> None:
    """Put every param_tensor of a sample back to the values it was made with (ggml
    computes opt_step in place: a second path must start where the first did)."""
    for a in sample.args:
        if isinstance(a, pyggml.Tensor) and id(a) in _PARAMS:
            _restore(a)


def ref_cross_entropy_loss(a, b):
    """-(1/rows) * sum over rows of sum_i b_i * log_softmax(a)_i, as a 1-element tensor"""
    m = a.max(axis=-1, keepdims=True)
    logsm = a - m - np.log(np.sum(np.exp(a - m), axis=-1, keepdims=True))
    rows = a.size // a.shape[-1] if a.size else 0
    return np.array([-np.sum(b * logsm) / rows])


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _cross_entropy_samples(rng, t):
    # the first three (contiguous) are the gradient check's: labels rows sum to 1, as
    # ggml's backward (softmax - labels) assumes; the labels are no parameter (ggml has
    # no gradient for them)
    for shape in ((3, 5), (2, 3, 4), (1, 7)):
        yield Sample((Arg(normal(rng, shape, 2.0), t), Arg(_softmax(normal(rng, shape)), t, param=False)),
                     f"{shape} soft labels")
    onehot = np.eye(6)[rng.integers(0, 6, size=4)]
    yield Sample((Arg(normal(rng, (4, 6)), t), Arg(onehot, t, param=False)), "one-hot labels")
    yield Sample((Arg(normal(rng, (4, 1)), t), Arg(np.ones((4, 1)), t, param=False)), "rows of one element")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t, "strided"), Arg(_softmax(normal(rng, (2, 3, 4))), t, "strided",
                                                                     param=False)), "strided rows")
    yield Sample((Arg(normal(rng, (3, 5)), t), Arg(uniform(rng, (3, 5), 0.0, 1.0), t, param=False)),
                 "labels not normalized")


ADAMW_KEYS = ("alpha", "beta1", "beta2", "eps", "wd", "beta1h", "beta2h")


def _adamw_params(alpha=0.1, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01, step=3):
    return np.array([alpha, beta1, beta2, eps, wd, 1 / (1 - beta1 ** step), 1 / (1 - beta2 ** step)])


def ref_opt_step_adamw(w, g, m, v, p):
    """AdamW (decoupled weight decay): m, v moving averages; bias corrections given as
    beta1h = 1/(1 - beta1^t), beta2h = 1/(1 - beta2^t); returns the new parameter"""
    w = _restore(w)
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = np.asarray(p, np.float64).reshape(-1)
    m1 = m * beta1 + g * (1 - beta1)
    v1 = v * beta2 + g * g * (1 - beta2)
    return w * (1 - alpha * wd) - alpha * (m1 * beta1h) / (np.sqrt(v1 * beta2h) + eps)


def _adamw_samples(rng, t):
    for shape, kw in (((3, 5), {}), ((2, 3, 4), {"wd": 0.0, "step": 1}), ((7,), {"alpha": 1e-3}),
                      ((1, 1), {}), ((2, 1, 3, 2), {"beta1": 0.5, "beta2": 0.9})):
        yield Sample((param_tensor(normal(rng, shape)), Arg(normal(rng, shape), t), Arg(normal(rng, shape, 0.1), t),
                      Arg(uniform(rng, shape, 0.05, 1.0), t), Arg(_adamw_params(**kw), t)),
                     f"{shape} {kw or 'defaults'}")


def ref_opt_step_sgd(w, g, p):
    """w * (1 - alpha * wd) - alpha * g"""
    w = _restore(w)
    alpha, wd = np.asarray(p, np.float64).reshape(-1)
    return w * (1 - alpha * wd) - alpha * g


def _sgd_samples(rng, t):
    for shape, p in (((3, 5), (0.1, 0.01)), ((2, 3, 4), (0.5, 0.0)), ((7,), (1e-3, 0.1)), ((1, 1), (0.1, 0.01))):
        yield Sample((param_tensor(normal(rng, shape)), Arg(normal(rng, shape), t), Arg(np.array(p), t)),
                     f"{shape} alpha, wd = {p}")


OPINFOS = [
    OpInfo("cross_entropy_loss", ref=ref_cross_entropy_loss, samples=_cross_entropy_samples, grad=True,
           note="ggml's gradient is (softmax(a) - b)/rows, the true one only for label rows that sum to 1: the "
                "gradient samples have such labels"),
    OpInfo("opt_step_adamw", ref=ref_opt_step_adamw, samples=_adamw_samples,
           note="a is a parameter Tensor made by pyggml.opinfo.train.param_tensor (an Arg cannot be flagged)"),
    OpInfo("opt_step_sgd", ref=ref_opt_step_sgd, samples=_sgd_samples,
           note="a is a parameter Tensor made by pyggml.opinfo.train.param_tensor (an Arg cannot be flagged)"),
]
