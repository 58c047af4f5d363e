"""Type stubs for pyggml._attn."""

from typing import Any

import numpy as np

from pyggml._core import Context, Tensor

__all__ = ["ISAS", "WORK_PER_THREAD", "blocked_backward", "blocked_backward_node", "blocked_offsets", "default_threads",
           "fma_peak", "set_isa"]

def blocked_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, d: np.ndarray, lse: np.ndarray | None,
                     o: np.ndarray | None, scale: float, masked: bool, grouping: int,
                     n_threads: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
ISAS: dict[str, int]

def set_isa(name: str) -> str: ...
WORK_PER_THREAD: int
def default_threads(B: int, H: int, N: int, M: int, D: int, masked: bool) -> int: ...
def _set_panels(on: bool) -> bool: ...
def fma_peak(isa: str = ..., seconds: float = ..., repeat: int = ...) -> float | None: ...
def blocked_offsets(q: Any, k: Any) -> tuple[int, int, int, int]: ...
def blocked_backward_node(ctx: Context, q: Any, k: Any, v: Any, d: Any, scale: float, masked: bool, grouping: int,
                          lse: Any = None, o: Any = None) -> Tensor: ...
