"""The repository's files that are not installed (scripts/*.py, pyggml's build inputs
such as _gen_ops.py and _kernels.py), loaded as modules for the tests from the source
tree, under a name of their own."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_source(relpath: str, name: str):
    """ROOT/relpath as module ``name`` (registered in sys.modules: dataclasses look their
    module up there)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_script(name: str, as_name: str | None = None):
    """scripts/NAME.py"""
    return load_source(f"scripts/{name}.py", as_name or name)
