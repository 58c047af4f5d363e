"""Models written with pyggml's public API, each beside its float64 NumPy reference:
the architectures ``pyggml parity --model`` can check node by node.

* ``pyggml.models.gemma3``: Gemma 3 (GGUF ``general.architecture`` "gemma3").
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pyggml.errors import ArgumentError

__all__ = ["ARCHITECTURES", "module_for"]

ARCHITECTURES = ("gemma3",)


def module_for(architecture: str) -> ModuleType:
    """The module of a GGUF ``general.architecture``; ArgumentError for one pyggml has not
    written."""
    if not isinstance(architecture, str) or architecture not in ARCHITECTURES:
        raise ArgumentError(f"no pyggml model for the architecture {architecture!r} "
                            f"(written: {', '.join(ARCHITECTURES)})")
    return importlib.import_module(f"pyggml.models.{architecture}")
