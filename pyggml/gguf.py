"""GGUF files from Python: metadata and tensors, the weights never copied.

::

    import pyggml.gguf
    with pyggml.gguf.load("model.gguf") as f:
        f.metadata["general.architecture"]          # 'gemma3'
        w = f.tensors["token_embd.weight"]           # a pyggml.Tensor over the file's bytes
        pyggml.dequantize(w)                         # float32 values, as ggml computes them

ggml's own reader (``gguf_init_from_file``) parses the file; pyggml checks what it does not
(every tensor's data inside the file), maps the file and places the tensors on the mapping
(a ggml CPU buffer over it), so graphs built from them read the weights in place. The
tensors live in a ``no_alloc`` context (``GGUFFile.context``) that holds the mapping while it
is open; numpy views of the tensors hold it after. The mapping is private (copy on write):
``Tensor.set`` on a weight changes this process's copy, never the file.

Errors: :class:`pyggml.GGUFError` for a file ggml's reader refuses (its logged reason in the
message) or whose tensor data lies past its end; :class:`pyggml.GGMLAbort` if ggml's reader
would abort on it; ``OSError`` (``FileNotFoundError``, ...) when the file cannot be opened
or mapped, as Python's own file functions raise.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from pyggml._core import Context, Tensor
from pyggml._gguf import read as _read
from pyggml.errors import GGMLTypeError

__all__ = ["GGUFFile", "load"]


class GGUFFile:
    """A GGUF file read by :func:`load`.

    Attributes: ``path``; ``version`` (of the format); ``alignment`` (of the tensor data);
    ``data_offset`` (where the tensor data starts); ``file_size``; ``metadata`` ({key: value}
    in the file's order: ints, floats, bools, str, lists of str, numpy arrays);
    ``tensors`` ({name: Tensor} in the file's order); ``context`` (the no_alloc Context
    holding the tensors)."""

    path: str
    version: int
    alignment: int
    data_offset: int
    file_size: int
    metadata: dict[str, Any]
    tensors: dict[str, Tensor]
    context: Context

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise GGMLTypeError(f"gguf.load: path must be a str, bytes or os.PathLike, not {type(path).__name__}")
        self.path = os.fsdecode(path)
        (self.version, self.alignment, self.data_offset, self.metadata, self.context, self.tensors,
         self.file_size) = _read(self.path)

    def close(self) -> None:
        """Close the context: its tensors are unusable after; the mapping goes when no numpy
        view of a tensor holds it."""
        self.context.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        arch = self.metadata.get("general.architecture", "?")
        return (f"<GGUFFile {self.path!r}: GGUF v{self.version}, {arch}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors>")


def load(path: str | os.PathLike[str]) -> GGUFFile:
    """load(path) -> GGUFFile: read a GGUF file's metadata and map its tensors (no copy)."""
    return GGUFFile(path)
