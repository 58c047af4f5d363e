"""Type stubs for pyggml._gguf."""

import os
from typing import Any

from pyggml._core import Context, Tensor

__all__ = ["read"]

def read(path: str | bytes | os.PathLike[str]) -> tuple[int, int, int, dict[str, Any], Context, dict[str, Tensor], int]: ...
