"""Type stubs for pyggml._gguf."""

import os
from typing import Any

from pyggml._core import Context, Tensor

__all__ = ["TYPES", "read", "write"]

TYPES: dict[str, int]

def read(
    path: str | bytes | os.PathLike[str],
) -> tuple[int, int, int, dict[str, Any], dict[str, str], Context, dict[str, Tensor], int]: ...
def write(path: str | bytes | os.PathLike[str], kvs: list[Any], tensors: list[Tensor]) -> None: ...
