"""Every exception the Python layer raises on bad input is a pyggml.GGMLError (and the
builtin a caller expects), as the guide promises (docs/site/guides/scripting.md): attention_backward and opt.fit used to
raise plain ValueError and TypeError."""

import numpy as np
import pytest

import pyggml
from pyggml import opt
from pyggml.errors import ArgumentError, GGMLError, GGMLTypeError

Q = np.zeros((1, 2, 4, 8), np.float32)


@pytest.mark.parametrize("call, cls, builtin", [
    (lambda: pyggml.attention_backward(Q, Q, Q, Q, kernel="nonesuch"), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q, Q, Q, mapping="diagonal"), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q[:, :, :2], Q[:, :, :2], Q, masked=True), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q, Q, Q.astype(np.float64)), GGMLTypeError, TypeError),
    (lambda: pyggml.attention_backward(Q.tolist(), Q, Q, Q), GGMLTypeError, TypeError),
    (lambda: pyggml.attention_backward(Q, Q[..., :4], Q[..., :4], Q), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q, Q, Q, scale=0.0), ArgumentError, ValueError),
    (lambda: pyggml.flash_attn_back_grads(None), GGMLTypeError, TypeError),
])
def test_attention_entry_points_raise_ggml_errors(call, cls, builtin):
    with pytest.raises(cls) as info:
        call()
    assert isinstance(info.value, GGMLError) and isinstance(info.value, builtin)


@pytest.mark.parametrize("kw, match", [({"nepoch": 0}, "nepoch"), ({"nepoch": 1, "val_split": 1.5}, "val_split")])
def test_fit_raises_ggml_errors(kw, match):
    with pytest.raises(ArgumentError, match=match) as info:
        opt.fit(None, None, **kw)
    assert isinstance(info.value, ValueError)


# --- the tree the docs draw is the tree of the classes ------------------------------------

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pyggml.errors as errors
from public_api import public_callables

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(?P<indent>[│ ]*)(?:[├└]── )?(?P<name>[A-Za-z]+)(?: \((?P<builtin>[A-Za-z]+)\))?(?:\s|$)")


def drawn_tree(text):
    """{class name: (parent name or None, builtin named in parentheses or None)} from a
    box-drawing tree that starts at ``GGMLError``."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() == "GGMLError")
    base = len(lines[first]) - len(lines[first].lstrip())      # the docstring's indentation
    out, stack = {}, []
    for line in lines[first:]:
        line = line[base:]
        if not line.strip() or not re.match(r"^[│ ├└A-Z]", line):
            break
        m = LINE.match(line)
        assert m, line
        depth = len(m["indent"]) // 4 + (0 if line.startswith("GGMLError") else 1)
        del stack[depth:]
        out[m["name"]] = (stack[-1] if stack else None, m["builtin"])
        stack.append(m["name"])
    return out


def class_tree():
    classes = {n: c for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.GGMLError)}
    out = {}
    for name, cls in classes.items():
        ours = [b for b in cls.__bases__ if issubclass(b, errors.GGMLError)]
        builtin = [b.__name__ for b in cls.__bases__ if not issubclass(b, errors.GGMLError) and b is not Exception]
        out[name] = (ours[0].__name__ if ours else None, builtin[0] if builtin else None)
    return out


@pytest.mark.parametrize("where", ["errors.py", "docs/site/guides/scripting.md"])
def test_the_drawn_exception_tree_is_the_class_tree(where):
    text = errors.__doc__ if where == "errors.py" else (ROOT / where).read_text()
    assert drawn_tree(text) == class_tree()
    assert sorted(errors.__all__) == sorted(class_tree())


def test_every_exception_class_is_a_ggml_error_and_its_builtin():
    for name, (parent, builtin) in class_tree().items():
        cls = getattr(errors, name)
        assert issubclass(cls, errors.GGMLError) and cls.__module__ == "pyggml.errors"
        if parent is None:
            assert name == "GGMLError" or builtin, name      # a root class names its builtin
        assert getattr(pyggml, name) is cls and name in pyggml.__all__    # re-exported, the same class


# --- every public entry point, called with bad values, raises only GGMLErrors ----------------

WALK = r'''
import contextlib, inspect, io, json, re
import numpy as np
import pyggml
from pyggml.errors import GGMLError
from public_api import module_callables, public

BAD = [None, "bad", object(), -1, 2 ** 70, 1e300, np.zeros((2, 2))]
# the interpreter's own complaint about the number of arguments is not a bad value
ARITY = re.compile(r"takes (exactly|at most|at least|no|from) .*arguments?|missing \d+ required|"
                   r"unexpected keyword|positional arguments? but \d+ (was|were) given|takes no arguments")
offenders, calls = {}, [0]

def call(name, f, args):
    calls[0] += 1
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            f(*args)
    except GGMLError:
        pass
    except FileNotFoundError:
        # a path that names no file: what Python's own file functions raise (pyggml.gguf)
        if not name.startswith("pyggml.gguf."):
            offenders.setdefault(name, "FileNotFoundError")
    except TypeError as e:
        if not ARITY.search(str(e)):
            offenders.setdefault(name, f"TypeError: {e}")
    except Exception as e:
        offenders.setdefault(name, f"{type(e).__name__}: {e}")

def arities(f):
    try:
        ps = [p for p in inspect.signature(f).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        return [len(ps)]
    except (TypeError, ValueError):       # a Cython class: no signature; try 1 to 3 arguments
        return [1, 2, 3]

def walk(name, f):
    for n in arities(f):
        for bad in BAD:
            for i in range(n):
                call(name, f, [bad if j == i else None for j in range(n)])
            if n > 1:
                call(name, f, [bad] * n)

for name, f in module_callables():
    if name != "pyggml.demo":              # the demo computes; it takes no argument to check
        walk(name, f)

with pyggml.Context(1 << 22) as ctx:
    x = ctx.new_tensor(pyggml.Type.F32, [4, 3])
    g = pyggml.Graph(ctx)
    g.build_forward_expand(pyggml.sum(ctx, x))
    cpu = pyggml.Backend("CPU")
    objects = [ctx, x, g, cpu, pyggml.GraphAllocator(cpu), pyggml.Scheduler([cpu])]
    for obj in objects:
        for n in public(obj):
            m = getattr(obj, n)
            if callable(m) and n != "close":
                walk(f"{type(obj).__name__}.{n}", m)
print(json.dumps({"calls": calls[0], "offenders": offenders}))
'''


def test_the_public_api_raises_only_ggml_errors_on_bad_values():
    """Every public function, class and method of pyggml and pyggml.opt (and of a live
    Context, Tensor, Graph, Backend, GraphAllocator and Scheduler), called with each bad
    value in each argument: whatever it raises is a GGMLError. In a fresh interpreter, so
    that a crash is a failure with its exit status."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    proc = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=600,
                          cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["calls"] > 9000                    # the walk reached the op wrappers and the methods
    assert got["offenders"] == {}


def test_every_public_callable_has_a_signature():
    """inspect.signature() (help(), IDEs, the walk above) reads every public function's and
    method's parameters: the Cython modules are built with binding=False, where only the
    embedded text signature gives them, and a default must be a name Python can resolve
    (a C constant there would make the whole signature unreadable)."""
    import inspect
    names, unreadable = 0, []
    for name, f in public_callables():
        names += 1
        try:
            inspect.signature(f)
        except (TypeError, ValueError) as e:
            unreadable.append(f"{name}: {e}")
    assert names > 250 and not unreadable, unreadable
