"""Training with ggml-opt: :class:`Scheduler`, :class:`Dataset`, :class:`Optimizer`
(``ggml_opt_init`` with static graphs, ``epoch()``), and :func:`fit`, the loop over
epochs that ``ggml_opt_fit`` is, with a Python callable for the optimizer's
parameters per epoch and the results of every epoch returned instead of printed.
See the training example in docs/site/guides/examples.md."""

from __future__ import annotations

from typing import Any, Callable

from pyggml._backend import Scheduler
from pyggml._opt import LOSSES, OPTIMIZERS, Dataset, Optimizer, Result
from pyggml.errors import ArgumentError, GGMLTypeError

__all__ = ["LOSSES", "OPTIMIZERS", "Dataset", "Epoch", "Optimizer", "Result", "Scheduler", "fit"]


class Epoch:
    """One epoch of :func:`fit`: its number (from 1), the optimizer parameters it used,
    and its training and validation :class:`Result`."""

    def __init__(self, number: int, params: dict[str, float], train: Result, val: Result):
        self.number, self.params, self.train, self.val = number, params, train, val

    def __repr__(self) -> str:
        return (f"<Epoch {self.number}: train loss {self.train.loss:.4g} accuracy {self.train.accuracy:.4g}, "
                f"val loss {self.val.loss:.4g} accuracy {self.val.accuracy:.4g}>")


def fit(opt: Optimizer, dataset: Dataset, nepoch: int, val_split: float = 0.0,
        params: dict[str, float] | Callable[[int], dict[str, float]] | None = None,
        callback: Callable[[bool, int, int, Result], Any] | None = None, shuffle: bool = True) -> list[Epoch]:
    """Train ``opt`` on ``dataset`` for ``nepoch`` epochs, as ``ggml_opt_fit`` does: the
    last ``val_split`` of the data (whole batches) validates, the rest trains, shuffled
    before each epoch (the validation part once, at the start). ``params``: the
    optimizer's parameters, a dict or a callable of the epoch number (from 1) returning
    one. ``callback(train, ibatch, ibatch_max, result)`` after each batch. Returns one
    :class:`Epoch` per epoch."""
    if type(nepoch) is not int or nepoch < 1:
        raise ArgumentError(f"fit: nepoch must be an int >= 1, got {nepoch!r}")
    if type(val_split) not in (int, float) or not 0.0 <= val_split < 1.0:
        raise ArgumentError(f"fit: val_split must be in [0, 1), got {val_split!r}")
    if not isinstance(opt, Optimizer):
        raise GGMLTypeError(f"fit: opt must be a pyggml.opt.Optimizer, not {type(opt).__name__}")
    if not isinstance(dataset, Dataset):
        raise GGMLTypeError(f"fit: dataset must be a pyggml.opt.Dataset, not {type(dataset).__name__}")
    if params is not None and not callable(params) and not isinstance(params, dict):
        raise GGMLTypeError(f"fit: params must be a dict, a callable or None, not {type(params).__name__}")
    if callback is not None and not callable(callback):
        raise GGMLTypeError(f"fit: callback must be callable or None, not {type(callback).__name__}")
    batch = opt.batch_size
    nbatches = dataset.ndata // batch
    idata_split = int((1.0 - val_split) * nbatches) * batch
    if shuffle and batch < dataset.ndata:
        opt.shuffle(dataset, -1)                      # training and validation points, once
    history = []
    for epoch in range(1, nepoch + 1):
        p = params(epoch) if callable(params) else dict(params or {})
        if shuffle and batch < idata_split:
            opt.shuffle(dataset, idata_split)
        train, val = opt.epoch(dataset, idata_split, p, callback)
        history.append(Epoch(epoch, p, train, val))
    return history
