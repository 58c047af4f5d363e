"""GGUF files for the tests, written by gguf-py (llama.cpp's own package: the independent side)."""

import gguf


def write_gguf(path, tensors=None, kv=None, arch="tiny"):
    """Write ``path``: ``kv`` {key: (GGUFWriter adder name, value)} in order, then
    ``tensors`` {name: (array, raw_dtype or None)}. Returns ``path``."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, (adder, value) in (kv or {}).items():
        getattr(w, adder)(key, value)
    for name, (arr, raw) in (tensors or {}).items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
