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
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import numpy as np

from pyggml._core import Context, Tensor
from pyggml._gguf import TYPES
from pyggml._gguf import read as _read
from pyggml._gguf import write as _write
from pyggml.errors import ArgumentError, GGMLTypeError

__all__ = ["GGUFFile", "load", "save"]

# the numeric GGUF types and their numpy dtypes (GGUF is little-endian)
_NUMERIC = {"uint8": "<u1", "int8": "<i1", "uint16": "<u2", "int16": "<i2", "uint32": "<u4", "int32": "<i4",
            "uint64": "<u8", "int64": "<i8", "float32": "<f4", "float64": "<f8", "bool": "|b1"}
_BY_DTYPE = {np.dtype(v): k for k, v in _NUMERIC.items()}


class GGUFFile:
    """A GGUF file read by :func:`load`.

    Attributes: ``path``; ``version`` (of the format); ``alignment`` (of the tensor data);
    ``data_offset`` (where the tensor data starts); ``file_size``; ``metadata`` ({key: value}
    in the file's order: ints, floats, bools, str, lists of str, numpy arrays);
    ``types`` ({key: GGUF type}: "uint32", "float32", "string", "array[string]", ...: what
    :func:`save` needs to write the same file again); ``tensors`` ({name: Tensor} in the
    file's order); ``context`` (the no_alloc Context holding the tensors)."""

    path: str
    version: int
    alignment: int
    data_offset: int
    file_size: int
    metadata: dict[str, Any]
    types: dict[str, str]
    tensors: dict[str, Tensor]
    context: Context

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise GGMLTypeError(f"gguf.load: path must be a str, bytes or os.PathLike, not {type(path).__name__}")
        self.path = os.fsdecode(path)
        (self.version, self.alignment, self.data_offset, self.metadata, self.types, self.context, self.tensors,
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


def _infer(key: str, value: Any) -> str:
    """The GGUF type a value is written as when ``types`` does not say."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (np.generic, np.ndarray)):
        elem = _BY_DTYPE.get(value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype)
        if elem is not None:
            return elem if isinstance(value, np.generic) else f"array[{elem}]"
    elif isinstance(value, int):
        if -2 ** 31 <= value < 2 ** 31:
            return "int32"
        if -2 ** 63 <= value < 2 ** 64:
            return "int64" if value < 2 ** 63 else "uint64"
    elif isinstance(value, float):
        return "float32"
    elif isinstance(value, (str, bytes)):
        return "string"
    elif isinstance(value, (list, tuple)):
        if all(isinstance(v, (str, bytes)) for v in value) and value:
            return "array[string]"
        if all(isinstance(v, (bool, np.bool_)) for v in value) and value:
            return "array[bool]"
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
            return "array[int32]" if all(-2 ** 31 <= int(v) < 2 ** 31 for v in value) else "array[int64]"
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value):
            return "array[float32]"
    raise GGMLTypeError(f"gguf.save: key {key!r}: no GGUF type for a {type(value).__name__} (give one in types=)")


def _text(key: str, v: Any) -> bytes:
    b = v.encode("utf-8") if isinstance(v, str) else v
    if not isinstance(b, bytes):
        raise GGMLTypeError(f"gguf.save: key {key!r}: a GGUF string must be a str or bytes, not {type(v).__name__}")
    if b"\0" in b:
        raise ArgumentError(f"gguf.save: key {key!r}: a GGUF string cannot hold NUL (ggml reads it as a C string)")
    return b


def _numbers(key: str, value: Any, tname: str) -> bytes:
    """``value`` (a scalar or a 1-D sequence) as the little-endian bytes of ``tname``, every
    element representable (no wrap-around, no silent rounding of integers)."""
    dtype = np.dtype(_NUMERIC[tname])
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise GGMLTypeError(f"gguf.save: key {key!r}: not numbers: {e}") from None
    if arr.dtype.kind not in "biuf" or (dtype.kind in "biu" and arr.dtype.kind == "f"):
        raise GGMLTypeError(f"gguf.save: key {key!r}: {arr.dtype} values cannot be written as {tname}")
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise ArgumentError(f"gguf.save: key {key!r}: {lo if lo < info.min else hi} does not fit {tname}")
    return arr.astype(dtype).tobytes()


def save(path: str | os.PathLike[str], tensors: Mapping[str, Tensor] | Iterable[Tensor] = (),
         metadata: Mapping[str, Any] | None = None, types: Mapping[str, str] | None = None) -> None:
    """save(path, tensors=(), metadata=None, types=None): write a GGUF file with ggml's own
    writer (``gguf_write_to_file``): the keys of ``metadata`` in order, then the tensors (a
    sequence, or a mapping whose keys are the tensors' names) with their data.

    A key's GGUF type comes from ``types`` ({key: "uint32", "float64", "string",
    "array[int16]", ...: what ``GGUFFile.types`` gives, so that ``save(p, f.tensors,
    f.metadata, f.types)`` writes the same keys and types back), else from its value: bool,
    int (int32, else int64, else uint64), float (float32, GGUF's usual), str, numpy scalars
    and 1-D arrays (their dtype), lists of str, bools, ints or floats. Tensors must be named
    (uniquely), contiguous and have data; a tensor in device memory is read through its
    backend. Raises GGMLTypeError/ArgumentError for what ggml would abort on or misread, and
    GGUFError when ggml cannot write the file (its logged reason in the message)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise GGMLTypeError(f"gguf.save: path must be a str, bytes or os.PathLike, not {type(path).__name__}")
    if metadata is None:
        metadata = {}
    if types is None:
        types = {}
    if not isinstance(metadata, Mapping) or not isinstance(types, Mapping):
        raise GGMLTypeError("gguf.save: metadata and types must be mappings")
    if isinstance(tensors, Tensor) or not isinstance(tensors, (Mapping, Iterable)):
        raise GGMLTypeError(f"gguf.save: tensors must be a sequence or a mapping of Tensors, "
                            f"not {type(tensors).__name__}")
    items = list(tensors.items()) if isinstance(tensors, Mapping) else [(None, t) for t in tensors]
    names: set[str] = set()
    tlist = []
    for key, t in items:
        if not isinstance(t, Tensor):
            raise GGMLTypeError(f"gguf.save: tensors must be Tensors, not {type(t).__name__}")
        name = t.name
        if key is not None and key != name:
            raise ArgumentError(f"gguf.save: the key {key!r} is not the tensor's name {name!r} (ggml writes the "
                                f"tensor's own name: set t.name)")
        if not name:
            raise ArgumentError("gguf.save: a tensor without a name (set t.name): GGUF finds tensors by name")
        if name in names:
            raise ArgumentError(f"gguf.save: two tensors named {name!r} (ggml aborts on a duplicate name)")
        names.add(name)
        tlist.append(t)
    kvs: list[tuple[str, int, int, bytes | list[bytes]]] = []
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise GGMLTypeError(f"gguf.save: a metadata key must be a non-empty str, not {key!r}")
        tname = types.get(key) or _infer(key, value)
        if not isinstance(tname, str):
            raise GGMLTypeError(f"gguf.save: types[{key!r}] must be a str, not {type(tname).__name__}")
        if tname.startswith("array[") and tname.endswith("]"):
            elem = tname[6:-1]
            if elem == "string":
                if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                    raise GGMLTypeError(f"gguf.save: key {key!r}: array[string] takes a sequence of str")
                kvs.append((key, TYPES["array"], TYPES["string"], [_text(key, v) for v in value]))
            elif elem in _NUMERIC:
                if np.ndim(value) != 1:
                    raise ArgumentError(f"gguf.save: key {key!r}: an array must be one-dimensional")
                kvs.append((key, TYPES["array"], TYPES[elem], _numbers(key, value, elem)))
            else:
                raise ArgumentError(f"gguf.save: key {key!r}: unknown GGUF array type {tname!r}")
        elif tname == "string":
            kvs.append((key, TYPES["string"], 0, _text(key, value)))
        elif tname in _NUMERIC:
            if np.ndim(value) != 0:
                raise ArgumentError(f"gguf.save: key {key!r}: {tname} takes one value")
            if key == "general.alignment" and (tname != "uint32" or int(value) <= 0 or int(value) & (int(value) - 1)):
                raise ArgumentError("gguf.save: general.alignment must be a uint32 power of two (ggml aborts otherwise)")
            kvs.append((key, TYPES[tname], 0, _numbers(key, value, tname)))
        else:
            raise ArgumentError(f"gguf.save: key {key!r}: unknown GGUF type {tname!r}")
    _write(path, kvs, tlist)
