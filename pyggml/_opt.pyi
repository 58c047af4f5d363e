"""Type stubs for pyggml._opt."""

from typing import Any, Callable, final

import numpy as np

from pyggml._backend import Scheduler
from pyggml._core import Context, Tensor, Type

__all__ = ["Dataset", "Optimizer", "Result", "LOSSES", "OPTIMIZERS"]

LOSSES: dict[str, int]
OPTIMIZERS: dict[str, int]
DEFAULTS: dict[str, dict[str, float]]

@final
class Dataset:
    ndata: int
    ne_datapoint: int
    ne_label: int
    ndata_shard: int
    type_data: Type
    type_label: Type
    def __new__(cls, ndata: int, ne_datapoint: int, ne_label: int = 0, type_data: Type = ...,
                type_label: Type = ..., ndata_shard: int = 1) -> Dataset: ...
    @property
    def data(self) -> np.ndarray: ...
    @property
    def labels(self) -> np.ndarray | None: ...

class Result:
    ndata: int
    loss: float
    loss_unc: float
    accuracy: float
    accuracy_unc: float
    pred: np.ndarray
    def __init__(self, ndata: int, loss: float, loss_unc: float, accuracy: float, accuracy_unc: float,
                 pred: np.ndarray) -> None: ...

@final
class Optimizer:
    scheduler: Scheduler
    loss: str
    optimizer: str
    def __new__(cls, scheduler: Scheduler, ctx_compute: Context, inputs: Tensor, outputs: Tensor,
                loss: str = "cross_entropy", optimizer: str = "adamw", opt_period: int = 1) -> Optimizer: ...
    @property
    def batch_size(self) -> int: ...
    def reset(self, optimizer: bool = True) -> None: ...
    def shuffle(self, dataset: Dataset, idata: int = -1) -> None: ...
    def epoch(self, dataset: Dataset, idata_split: int = -1, params: dict[str, float] | None = None,
              callback: Callable[[bool, int, int, Result], Any] | None = None) -> tuple[Result, Result]: ...
