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


def read_lock(relpath: str = "vendor/ggml.lock") -> dict[str, str]:
    """The keys of a ggml pin (vendor/ggml.lock, or a lock in vendor/sdists/)."""
    return dict(line.split(" = ", 1) for line in (ROOT / relpath).read_text().splitlines()
                if " = " in line and not line.startswith("#"))


def lock_source(relpath: str = "vendor/ggml.lock") -> str:
    """What build_info()["ggml_source"] says of a build of that pin's tree."""
    lock = read_lock(relpath)
    return f"pypi:{lock['package']} sha256:{lock['sha256']}"


def built_from_the_pin() -> bool:
    """The linked ggml is the default pin's tree (vendor/ggml.lock), unpatched."""
    import pyggml
    return pyggml.build_info()["ggml_source"] == lock_source()
