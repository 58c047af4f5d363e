"""pyggml's public API, enumerated once: for tests/test_errors_public.py's bad-value walk
(which imports this module in a fresh interpreter) and its signature check."""

import inspect

import pyggml
from pyggml import gguf, models, opt
from pyggml.models import gemma3

MODULES = (pyggml, opt, gguf, models, gemma3)


def public(obj) -> list[str]:
    return [n for n in dir(obj) if not n.startswith("_")]


def module_callables():
    """(qualified name, object) for every public function and class of pyggml, pyggml.opt, pyggml.gguf
    and pyggml.models (gemma3 too);
    the exception classes and the IntEnums aside (Python's own protocols)."""
    for mod in MODULES:
        for n in getattr(mod, "__all__", None) or public(mod):
            obj = getattr(mod, n)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            if inspect.isclass(obj) and issubclass(obj, (BaseException, int)):
                continue
            yield f"{mod.__name__}.{n}", obj


def public_callables():
    """module_callables(), with each class replaced by its public methods (unbound)."""
    for name, obj in module_callables():
        if not inspect.isclass(obj):
            yield name, obj
            continue
        for m, v in vars(obj).items():
            if not m.startswith("_") and callable(getattr(obj, m)) and not isinstance(v, property):
                yield f"{name}.{m}", getattr(obj, m)
