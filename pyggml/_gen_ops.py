#!/usr/bin/env python3
"""Generate pyggml's op layer from the op table (pyggml/ops.txt) and the ggml.h being built.

Run by CMake at configure time (``python pyggml/_gen_ops.py --header .../ggml.h --out DIR``);
files are rewritten only when their content changes, so a rebuild recompiles only what an
edit touched. Writes into DIR:

* ``pyggml_ops.h``, ``pyggml_ops.c``: one guarded call per builder the linked ggml has
  (``pyggml_try_<name>``, see csrc/pyggml_rt.h), called through a function pointer typed
  as the table says; ``pyggml_ops_<family>.h`` declares one family's (its module includes
  only that one, so an edited row recompiles one module). The C file is compiled with ``-Werror=incompatible-pointer-types``:
  a row whose types drift from the header (a narrowed or reordered parameter) fails the
  build.
* ``_ops_<family>.pyx`` and ``.pyi``: the Python wrappers and their stubs, one module per
  family of the table (a module never defines an op named like a builtin it uses).
* ``_ops.py``: imports every wrapper; ``pyggml/__init__.py`` re-exports it.
* ``_optable.py``: the table as data, with what the linked ggml has (for
  ``op_coverage()``, the tests and the fuzzer).
* ``enum_members.pxi``: the members of ggml's enums in the header, for ``pyggml._core``,
  and ``_core.pyi``: pyggml/_core.pyi.in with those members filled in.
* ``ops_manifest.cmake``: the family modules, for CMake.

Why at build time and not committed: which builders exist, and with which signature,
depends on the ggml being built (the pinned release, an older one, master); the table
says what pyggml binds, the header what this ggml has, and both meet only here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import keyword
import os
import pprint
import re
import sys

# C types of the table -> (trampoline C type, Cython C type, Python stub type, conversion helper)
SCALARS = {
    "int": ("int", "int", "int", "_c.arg_int32"),
    "int32_t": ("int32_t", "int32_t", "int", "_c.arg_int32"),
    "int64_t": ("int64_t", "int64_t", "int", "_c.arg_int64"),
    "uint32_t": ("uint32_t", "uint32_t", "int", "_c.arg_uint32"),
    "size_t": ("size_t", "size_t", "int", "_c.arg_size"),
    "float": ("float", "float", "float", "_c.arg_float"),
    "bool": ("int", "int", "bool", "_c.arg_bool"),
}
# enum C type -> the IntEnum of pyggml._core that carries its values
ENUMS = {
    "enum ggml_type": "Type",
    "enum ggml_glu_op": "GluOp",
    "enum ggml_unary_op": "UnaryOp",
    "enum ggml_op_pool": "OpPool",
    "enum ggml_scale_mode": "ScaleMode",
    "enum ggml_sort_order": "SortOrder",
    "enum ggml_tri_type": "TriType",
}
# enums whose members enum_members.pxi lists: C enum -> (class name, member prefix)
ENUM_CLASSES = {
    "ggml_type": ("Type", "GGML_TYPE_"),
    "ggml_prec": ("Prec", "GGML_PREC_"),
    "ggml_op": ("Op", "GGML_OP_"),
    "ggml_unary_op": ("UnaryOp", "GGML_UNARY_OP_"),
    "ggml_glu_op": ("GluOp", "GGML_GLU_OP_"),
    "ggml_op_pool": ("OpPool", "GGML_OP_POOL_"),
    "ggml_scale_mode": ("ScaleMode", "GGML_SCALE_MODE_"),
    "ggml_scale_flag": ("ScaleFlag", "GGML_SCALE_FLAG_"),
    "ggml_sort_order": ("SortOrder", "GGML_SORT_ORDER_"),
    "ggml_tri_type": ("TriType", "GGML_TRI_TYPE_"),
    "ggml_op_hint": ("OpHint", "GGML_HINT_"),
    "ggml_rope_type": ("RopeType", "GGML_ROPE_TYPE_"),
}
# families of ggml.h's #defines read as enums: pseudo enum name -> member prefix
DEFINE_ENUMS = {"ggml_rope_type": "GGML_ROPE_TYPE_"}
# int parameters that take an enum's or a #define family's values: (the op the row makes, name) -> class
# (interpolate's mode: a ScaleMode, with ScaleFlag bits OR'd in)
INT_ENUM_PARAMS = {("ROPE", "mode"): "RopeType", ("ROPE_BACK", "mode"): "RopeType", ("UPSCALE", "mode"): "ScaleMode"}
# the Python builtins a family module must not shadow with an op of the same name (the
# wrappers never call builtins, but helpers in the module might one day)
FLAGS = {"inplace", "deprecated", "unbound", "impl=pyggml", "i32params"}


@dataclasses.dataclass
class Param:
    name: str
    ctype: str          # the C type as in ggml.h ("struct ggml_tensor *", "int", "int[4]", ...)
    kind: str           # tensor | tensor? | scalar | enum | array
    length: int = 0     # for arrays

    @property
    def pyname(self) -> str:
        """The Python name: the C name, with ``_`` appended to a Python keyword (``as_``)."""
        return self.name + "_" if keyword.iskeyword(self.name) else self.name


@dataclasses.dataclass
class Op:
    name: str
    since: str
    makes: str
    params: list[Param]
    flags: set[str]
    summary: str
    family: str
    line: int
    available: bool = True
    reason: str = ""

    @property
    def cname(self) -> str:
        """The C builder: ggml's, or pyggml's own for an impl=pyggml row (csrc/pyggml_rt.h)."""
        return ("pyggml_" if "impl=pyggml" in self.flags else "ggml_") + self.name

    @property
    def bound(self) -> bool:
        return "unbound" not in self.flags


class TableError(Exception):
    pass


def parse_param(text: str, where: str) -> Param:
    text = " ".join(text.split())
    m = re.fullmatch(r"(tensor\??) (\w+)", text)
    if m:
        return Param(m.group(2), "struct ggml_tensor *", m.group(1))
    m = re.fullmatch(r"(int|int64_t) (\w+)\[(\w+)\]", text)
    if m:
        n = 4 if m.group(3) in ("4", "GGML_MROPE_SECTIONS") else None
        if n is None:
            raise TableError(f"{where}: array length {m.group(3)} not understood")
        return Param(m.group(2), f"{m.group(1)}[{n}]", "array", n)
    m = re.fullmatch(r"int64_t \* (\w+)", text)
    if m:   # ggml_im2col_back's ne: 4 values
        return Param(m.group(1), "int64_t *", "array", 4)
    m = re.fullmatch(r"((?:enum )?\w+) (\w+)", text)
    if m and m.group(1) in SCALARS:
        return Param(m.group(2), m.group(1), "scalar")
    if m and m.group(1) in ENUMS:
        return Param(m.group(2), m.group(1), "enum")
    return Param(text.split()[-1], " ".join(text.split()[:-1]), "opaque")


def read_table(path: str) -> list[Op]:
    ops: list[Op] = []
    family = None
    seen = set()
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{lineno}"
            m = re.fullmatch(r"\[(\w+)\]", line)
            if m:
                family = m.group(1)
                continue
            cols = [c.strip() for c in line.split(" | ")]
            if len(cols) != 6:
                raise TableError(f"{where}: expected 6 columns separated by ' | ', got {len(cols)}")
            name, since, makes, params, flags, summary = cols
            if family is None:
                raise TableError(f"{where}: a row before the first [family]")
            if not re.fullmatch(r"[a-z_0-9]+", name) or name in seen:
                raise TableError(f"{where}: bad or repeated name {name!r}")
            seen.add(name)
            if not re.fullmatch(r"\d+\.\d+\.\d+", since):
                raise TableError(f"{where}: since must be a release like 0.9.4, got {since!r}")
            if not re.fullmatch(r"[A-Z_0-9]+|(UNARY|GLU):([A-Z_0-9]+|\*)", makes):
                raise TableError(f"{where}: makes {makes!r} is not OP, UNARY:X or GLU:X")
            flagset = {x.strip() for x in flags.split(",") if x.strip()}
            checks = {f for f in flagset if re.fullmatch(r"check=[a-z_0-9]+", f)}
            if flagset - FLAGS - checks:
                raise TableError(f"{where}: unknown flags {sorted(flagset - FLAGS - checks)}")
            plist = [parse_param(p, where) for p in params.split(",")] if params else []
            names = [p.name for p in plist]
            if len(set(names)) != len(names) or set(names) & {"ctx", "_guard", "_r", "_c"}:
                raise TableError(f"{where}: parameter names must be unique and not ctx, _guard, _r or _c")
            op = Op(name, since, makes, plist, flagset, summary, family, lineno)
            if op.bound and any(p.kind == "opaque" for p in plist):
                raise TableError(f"{where}: {name} has parameters pyggml cannot pass "
                                 f"({[p.ctype for p in plist if p.kind == 'opaque']}); mark it unbound")
            ops.append(op)
    return ops


# --- the header -------------------------------------------------------------------------

def strip_c_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def header_builders(src: str) -> dict[str, list[str]]:
    """Every ``struct ggml_tensor * ggml_x(struct ggml_context * ctx, ...)`` of ggml.h,
    with its parameter types (names dropped, arrays as ``T[n]``)."""
    out = {}
    pat = r"GGML_API\s+struct\s+ggml_tensor\s*\*\s*(ggml_\w+)\s*\(([^)]*)\)"
    for m in re.finditer(pat, src, flags=re.S):
        args = [" ".join(a.replace("*", " * ").split()) for a in m.group(2).split(",")]
        if not args or not re.fullmatch(r"struct ggml_context \* \w+", args[0]):
            continue
        out[m.group(1)] = [normalize_decl(a) for a in args[1:]]
    return out


def header_api(src: str) -> list[str]:
    """The name of every function ggml.h declares ``GGML_API`` (deprecated ones too),
    sorted: what the drift report compares between two ggml trees."""
    names = set()
    for m in re.finditer(r"GGML_API\b([^;{]*?)\b(ggml_\w+)\s*\(", src, flags=re.S):
        if "(" not in m.group(1):           # the first parenthesis is the function's own
            names.add(m.group(2))
    return sorted(names)


def normalize_decl(decl: str) -> str:
    """A parameter declaration without its name: 'int sections[GGML_MROPE_SECTIONS]' -> 'int[4]'."""
    decl = " ".join(decl.replace("*", " * ").split())
    m = re.fullmatch(r"(.*?) ?(\w+)\[(\w+)\]", decl)
    if m:
        n = "4" if m.group(3) in ("4", "GGML_MROPE_SECTIONS") else m.group(3)
        return f"{m.group(1)}[{n}]"
    return " ".join(decl.split()[:-1])


def header_enums(src: str) -> dict[str, list[str]]:
    out = {}
    for m in re.finditer(r"enum\s+(\w+)\s*\{([^}]*)\}", src):
        members = []
        for item in m.group(2).split(","):
            item = item.strip()
            if item:
                members.append(item.split("=")[0].strip())
        out[m.group(1)] = members
    for name, prefix in DEFINE_ENUMS.items():
        found = re.findall(rf"^\s*#\s*define\s+({prefix}\w+)\s", src, flags=re.M)
        if found:
            out[name] = list(dict.fromkeys(found))
    return out


def int_enum(op: Op, p: Param) -> str | None:
    """The IntEnum a plain int parameter takes its values from (RopeType for rope's mode)."""
    return INT_ENUM_PARAMS.get((op.makes, p.name)) if p.kind == "scalar" else None


def header_version(path: str) -> str:
    """GGML_VERSION from the tree's CMakeLists.txt next to include/, if there is one."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    parts = {}
    try:
        text = open(os.path.join(root, "CMakeLists.txt")).read()
    except OSError:
        return "unknown"
    for key in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"set\(GGML_VERSION_{key}\s+(\d+)\)", text)
        if m:
            parts[key] = m.group(1)
    if len(parts) == 3:
        return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    return "unknown"


DEFECTS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "defects.py")


def load_defects(path: str = DEFECTS_PY):
    """pyggml/defects.py as a module, loaded from its file (it imports nothing of pyggml at
    the top: no build is needed). The records, and the one release parser (release_key)."""
    name = "_pyggml_defects_loaded"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TableError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod             # dataclasses looks its module up
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    return mod


def resolve(ops: list[Op], builders: dict[str, list[str]], strict: bool = False,
            enums: dict[str, list[str]] | None = None, version: str = "unknown") -> None:
    """Mark the rows this ggml.h cannot bind (absent, or another signature).

    ``strict`` (the pinned release): every row is bound as the table declares it, and a
    row that drifted from the header fails the build at its typed function pointer; a row
    of a newer release (``since`` after ``version``, the header's) is checked as on any
    other release: unavailable where the header lacks it or declares it otherwise. An
    impl=pyggml row calls pyggml's own builder: it is available where ggml's op enum has
    the op its node is (``enums``: the header's enums).
    """
    release = load_defects().release_key
    for op in ops:
        if not op.bound:
            op.available = False
            op.reason = "custom C callbacks are not bound yet"
            continue
        if "impl=pyggml" in op.flags:
            if not strict and f"GGML_OP_{op.makes}" not in (enums or {}).get("ggml_op", []):
                op.available = False
                op.reason = f"this ggml has no GGML_OP_{op.makes} (pyggml builds the node itself)"
            continue
        have = builders.get(op.cname)
        want = [p.ctype for p in op.params]
        if strict and not (release(version) and release(op.since) > release(version)):
            continue
        if have is None:
            op.available = False
            op.reason = f"this ggml has no {op.cname} (pyggml's table: since {op.since})"
        elif have != want:
            op.available = False
            op.reason = (f"{op.cname} of this ggml takes ({', '.join(have)}); pyggml binds "
                         f"({', '.join(want)}) (since {op.since})")


# --- C ----------------------------------------------------------------------------------

def c_param_type(p: Param, trampoline: bool) -> str:
    """The C type of a parameter in the typed pointer (exact) or the trampoline (simple)."""
    if p.kind in ("tensor", "tensor?"):
        return "struct ggml_tensor *"
    if p.kind == "array":
        return ("int64_t *" if p.ctype.startswith("int64_t") else "int *")
    if p.kind == "enum":
        return "int" if trampoline else p.ctype
    if trampoline:
        return SCALARS[p.ctype][0]
    return p.ctype


def c_cast(p: Param) -> str:
    if p.kind == "enum":
        return f"({p.ctype}) {p.name}"
    if p.ctype == "bool":
        return f"{p.name} != 0"
    return p.name


def c_signature(op: Op) -> str:
    """The parameters of ``pyggml_try_<name>``: the guard, the context, the row's own."""
    return ", ".join(["pyggml_guard * pg_guard", "struct ggml_context * pg_ctx"]
                     + [f"{c_param_type(p, True)} {p.name}" for p in op.params])


def gen_family_header(family: str, ops: list[Op]) -> str:
    """pyggml_ops_<family>.h: the guarded calls of one family's builders this ggml has.
    Its module includes only this header, so an edited row recompiles one module."""
    h = [f"/* Generated by pyggml/_gen_ops.py from pyggml/ops.txt ([{family}]): do not edit. */",
         "#pragma once", '#include "pyggml_rt.h"', ""]
    for op in ops:
        if op.available:
            h.append(f"PYGGML_RT_API struct ggml_tensor * pyggml_try_{op.name}({c_signature(op)});")
    return "\n".join(h) + "\n"


def gen_c(ops: list[Op]) -> tuple[str, str]:
    """pyggml_ops.h (the PYGGML_ROW_* macros and every family's header) and pyggml_ops.c."""
    h = ["/* Generated by pyggml/_gen_ops.py from pyggml/ops.txt: do not edit. */",
         "#pragma once", '#include "pyggml_rt.h"', ""]
    for family in dict.fromkeys(op.family for op in ops):
        h.append(f'#include "pyggml_ops_{family}.h"')
    h.append("")
    c = ["/* Generated by pyggml/_gen_ops.py from pyggml/ops.txt: do not edit.",
         " * Each builder is called through a pointer typed as the table declares it; built with",
         " * -Werror=incompatible-pointer-types, so a table row that drifts from ggml.h fails the build. */",
         "#include <stdbool.h>", '#include "pyggml_ops.h"', ""]
    for op in ops:
        # PYGGML_ROW_*, not PYGGML_HAVE_*: CMake's feature checks own that prefix (pyggml_config.h)
        h.append(f"#define PYGGML_ROW_{op.name.upper()} {int(op.available)}")
    h.append("")
    for op in ops:
        if not op.available:
            continue
        exact = ", ".join(["struct ggml_context *"] + [c_param_type(p, False) if p.kind != "array"
                                                       else ("int64_t *" if "int64" in p.ctype else "int *")
                                                       for p in op.params])
        simple = c_signature(op)
        call = ", ".join(["pg_ctx"] + [c_cast(p) for p in op.params])
        c.append(f"static struct ggml_tensor * (* const fn_{op.name})({exact}) = {op.cname};")
        c.append(f"struct ggml_tensor * pyggml_try_{op.name}({simple}) {{")
        c.append("    struct ggml_tensor * volatile pg_result = NULL;")
        c.append("    pyggml_guard_enter(pg_guard);")
        c.append("    if (setjmp(pg_guard->env) == 0) {")
        c.append(f"        pg_result = fn_{op.name}({call});")
        c.append("        pyggml_guard_leave(pg_guard);")
        c.append("    }")
        c.append("    return pg_result;")
        c.append("}")
        c.append("")
    return "\n".join(h) + "\n", "\n".join(c) + "\n"


# --- Cython -----------------------------------------------------------------------------

def cy_decl(op: Op) -> str:
    args = ["pyggml_guard * pg_guard", "ggml_context * pg_ctx"]
    for p in op.params:
        if p.kind in ("tensor", "tensor?"):
            args.append(f"ggml_tensor * {p.name}")
        elif p.kind == "array":
            args.append(f"{'int64_t' if 'int64' in p.ctype else 'int'} * {p.name}")
        elif p.kind == "enum":
            args.append(f"int {p.name}")
        else:
            args.append(f"{SCALARS[p.ctype][1]} {p.name}")
    return f"    ggml_tensor * pyggml_try_{op.name}({', '.join(args)})"


def signature(op: Op) -> str:
    return f"{op.name}({', '.join(['ctx'] + [p.pyname for p in op.params])})"


def docstring(op: Op) -> str:
    lines = [f"{signature(op)} -> Tensor", "", op.summary + ".", ""]
    params = []
    for p in op.params:
        if p.kind == "tensor":
            params.append(f"{p.pyname}: Tensor")
        elif p.kind == "tensor?":
            params.append(f"{p.pyname}: Tensor or None")
        elif p.kind == "array":
            params.append(f"{p.pyname}: {p.length} ints ({p.ctype})")
        elif p.kind == "enum":
            params.append(f"{p.pyname}: {ENUMS[p.ctype]}")
        elif int_enum(op, p):
            params.append(f"{p.pyname}: {int_enum(op, p)} or int ({p.ctype})")
        else:
            params.append(f"{p.pyname}: {SCALARS[p.ctype][2]} ({p.ctype})")
    lines.append(f"``{op.cname}({', '.join(['ctx'] + [p.name for p in op.params])})``; the result's "
                 f"op is {op.makes}{' (a view of its first tensor)' if 'inplace' in op.flags else ''}.")
    lines.append(f"ggml >= {op.since}.{' Deprecated in ggml.' if 'deprecated' in op.flags else ''}")
    if params:
        lines.append("Parameters, in C order: " + "; ".join(params) + ".")
    lines.append("Raises GGMLAbort where ggml's builder would abort (its message attached), "
                 "KernelPreconditionError/GGMLTypeError where the CPU kernel would not run, "
                 "ContextFullError where the result does not fit ctx.")
    if not op.available:
        lines.append(f"Not available in this build: {op.reason}.")
    return "\n".join("    " + x if x else "" for x in lines)


def gen_wrapper(op: Op) -> str:
    # ctx is checked by _c.arg_context (GGMLTypeError), not typed in the signature, where a
    # wrong type would raise Cython's builtin TypeError
    out = [f"def {op.name}({', '.join(['ctx'] + [p.pyname for p in op.params])}):",
           f'    """{docstring(op).lstrip()}\n    """']
    if not op.available:
        out.append(f"    raise _c.version_error({op.name!r}, {op.reason!r})")
        return "\n".join(out) + "\n"
    out.append(f"    cdef Context c_ctx = _c.arg_context(ctx, {op.name!r})")
    tensors = [p for p in op.params if p.kind in ("tensor", "tensor?")]
    for p in op.params:
        n, q = p.pyname, repr(p.pyname)
        if p.kind == "tensor":
            out.append(f"    cdef Tensor t_{p.name} = _c.arg_tensor({n}, {q}, {op.name!r})")
        elif p.kind == "tensor?":
            out.append(f"    cdef Tensor t_{p.name} = _c.arg_tensor_or_none({n}, {q}, {op.name!r})")
        elif p.kind == "array":
            ct = "int64_t" if "int64" in p.ctype else "int"
            out.append(f"    cdef {ct} c_{p.name}[{p.length}]")
            fn = "arg_int64_array" if ct == "int64_t" else "arg_int32_array"
            out.append(f"    _c.{fn}({n}, c_{p.name}, {p.length}, {q}, {op.name!r})")
        elif p.kind == "enum":
            out.append(f"    cdef int c_{p.name} = _c.arg_enum({n}, {ENUMS[p.ctype]}, {q}, {op.name!r})")
        else:
            ct, cyt, _, conv = SCALARS[p.ctype]
            if p.ctype == "size_t" and "i32params" in op.flags:
                conv = "_c.arg_size_i32"     # the builder keeps it in an int32 op param
            elif p.ctype == "int64_t" and "i32params" in op.flags:
                conv = "_c.arg_int64_i32"    # the same, for an int64_t count (K, IC)
            out.append(f"    cdef {cyt} c_{p.name} = {conv}({n}, {q}, {op.name!r})")
    if "deprecated" in op.flags:
        out.append(f"    _c.deprecated({op.name!r})")
    for flag in sorted(op.flags):
        if flag.startswith("check="):     # a bespoke check, before the builder (pyggml/_prechecks.py)
            pyargs = ", ".join(f"t_{p.name}" if p.kind in ("tensor", "tensor?") else
                               (f"c_{p.name}" if p.kind != "array" else p.pyname) for p in op.params)
            out.append(f"    _prechecks.{flag[6:]}({op.name!r}, {pyargs})")
    args = []
    for p in op.params:
        if p.kind == "tensor":
            args.append(f"t_{p.name}.ptr")
        elif p.kind == "tensor?":
            args.append(f"(t_{p.name}.ptr if t_{p.name} is not None else NULL)")
        else:
            args.append(f"c_{p.name}")
    call_args = ", ".join(args)
    names = "(" + "".join(f"{p.pyname!r}, " for p in tensors) + ")"
    tvals = "(" + "".join(f"t_{p.name}, " for p in tensors) + ")"
    sep = ", " if call_args else ""
    out.append("    cdef pyggml_guard _guard")
    out.append(f"    cdef ggml_tensor * _r = pyggml_try_{op.name}(&_guard, _c.op_scratch(c_ctx){sep}{call_args})")
    out.append(f"    if _c.op_check(c_ctx, _r, &_guard, {op.name!r}):")
    out.append(f"        _c.op_fail(c_ctx, _r, &_guard, {op.name!r}, {names}, {tvals})")
    out.append(f"    _r = pyggml_try_{op.name}(&_guard, c_ctx.ptr{sep}{call_args})")
    out.append("    if _r == NULL:")
    out.append(f"        _c.op_lost(&_guard, {op.name!r})")
    for p in tensors:
        none = f"t_{p.name} is not None and " if p.kind == "tensor?" else ""
        out.append(f"    if {none}t_{p.name}.ctx is not c_ctx:")
        out.append(f"        c_ctx._depend_on(t_{p.name}.ctx)")
    rank = re.fullmatch(r"(?:reshape|view|cont)_([1-4])d", op.name)
    if rank:    # the rank asked for: a (1, H) reshape stays 2-d (pyggml/_core_tensor.pxi)
        out.append(f"    return _c.wrap_rank(c_ctx, _r, {rank.group(1)})")
    else:
        out.append("    return _c.wrap(c_ctx, _r)")
    return "\n".join(out) + "\n"


def gen_family(family: str, ops: list[Op]) -> str:
    out = ["# cython: language_level=3",
           f"# Generated by pyggml/_gen_ops.py from pyggml/ops.txt ([{family}]): do not edit.",
           f'"""ggml\'s {family} builders (generated from pyggml/ops.txt)."""',
           "",
           "from libc.stdint cimport int32_t, int64_t, uint32_t",
           "from pyggml._ggml cimport ggml_context, ggml_tensor",
           "from pyggml._rt cimport pyggml_guard",
           "from pyggml._core cimport Context, Tensor",
           "cimport pyggml._core as _c",
           "from pyggml import _prechecks",
           "from pyggml._core import " + ", ".join(sorted(set(ENUMS.values()))),
           "",
           f'cdef extern from "pyggml_ops_{family}.h" nogil:']
    decls = [cy_decl(op) for op in ops if op.available]
    out.extend(decls or ["    pass"])
    out.append("")
    out.append(f"__all__ = {[op.name for op in ops]!r}")
    out.append("")
    for op in ops:
        out.append("")
        out.append(gen_wrapper(op))
    return "\n".join(out)


def stub_type(p: Param, op: Op) -> str:
    if int_enum(op, p):
        return f"{int_enum(op, p)} | int"
    if p.kind == "tensor":
        return "Tensor"
    if p.kind == "tensor?":
        return "Tensor | None"
    if p.kind == "array":
        return "Sequence[int]"
    if p.kind == "enum":
        return f"{ENUMS[p.ctype]} | int"
    return SCALARS[p.ctype][2]


def gen_stub(family: str, ops: list[Op]) -> str:
    out = [f"# Generated by pyggml/_gen_ops.py from pyggml/ops.txt ([{family}]): do not edit.",
           "from typing import Sequence", "",
           "from pyggml._core import Context, Tensor, "
           + ", ".join(sorted(set(ENUMS.values()) | set(INT_ENUM_PARAMS.values()))), "",
           f"__all__ = {[op.name for op in ops]!r}", ""]
    for op in ops:
        params = ", ".join(["ctx: Context"] + [f"{p.pyname}: {stub_type(p, op)}" for p in op.params])
        out.append(f"def {op.name}({params}) -> Tensor: ...")
    return "\n".join(out) + "\n"


def gen_ops_py(families: dict[str, list[Op]]) -> str:
    out = ['"""Every graph builder pyggml binds (generated by pyggml/_gen_ops.py from pyggml/ops.txt)."""',
           ""]
    names = []
    for fam, ops in families.items():
        exported = [op.name for op in ops if op.bound]
        if exported:
            out.append(f"from pyggml._ops_{fam} import (  # noqa: F401")
            out.extend(f"    {n}," for n in exported)
            out.append(")")
        names.extend(exported)
    out.append("")
    out.append("__all__ = [")
    out.extend(f"    {n!r}," for n in names)
    out.append("]")
    return "\n".join(out) + "\n"


def gen_optable(ops: list[Op], builders: dict[str, list[str]], version: str, api: list[str] | None = None) -> str:
    rows = []
    for op in ops:
        rows.append({
            "name": op.name, "family": op.family, "since": op.since, "makes": op.makes,
            "params": [(p.name, p.ctype, p.kind) for p in op.params],
            "flags": sorted(op.flags), "summary": op.summary,
            "available": op.available, "reason": op.reason,
        })
    known = {op.cname for op in ops} | {"ggml_" + op.name for op in ops}
    extra = sorted(n for n in builders if n not in known and not n.startswith(("ggml_new_tensor",))
                   and n not in ("ggml_dup_tensor", "ggml_view_tensor", "ggml_get_tensor"))
    return ('"""The op table as data (generated by pyggml/_gen_ops.py from pyggml/ops.txt and the\n'
            'ggml.h of this build): for op_coverage(), the tests and the fuzzer."""\n\n'
            "from typing import Any\n\n"
            f"HEADER_VERSION = {version!r}\n\n"
            "# one dict per row of pyggml/ops.txt; `available`: this build binds it (else `reason`)\n"
            f"OPS: list[dict[str, Any]] = {pprint.pformat(rows, width=110, sort_dicts=False)}\n\n"
            "# builders of this ggml.h that the table does not know (new upstream)\n"
            f"HEADER_ONLY: list[str] = {extra!r}\n\n"
            "# every GGML_API function of this ggml.h (the drift report compares them)\n"
            f"API: list[str] = {pprint.pformat(api or [], width=110)}\n")


def gen_enum_pxi(enums: dict[str, list[str]]) -> str:
    """The members of ggml's enums: names as constant tuples, values in one C array.

    (Written as one C array read by a loop, not as a literal of (name, value) pairs: Cython
    expands each value of such a literal into its own inline conversion in the module's init
    function, which made _core's init 500 KB of machine code and half its compile time.)
    """
    out = ["# Generated by pyggml/_gen_ops.py from the ggml.h being built: do not edit.",
           "# The members of ggml's enums in this header; their values come from the compiler.", ""]
    values: list[str] = []
    lists: list[str] = []
    for cenum, (cls, prefix) in ENUM_CLASSES.items():
        members = [m for m in enums.get(cenum, []) if m.startswith(prefix)]
        members = [m for m in members if not m.endswith("_COUNT")]   # an older ggml may lack an enum
        names = "".join(f"{m[len(prefix):]!r}, " for m in members)
        lists.append(f"_{cls.upper()}_MEMBERS = _enum_members(({names}), {len(values)})")
        values.extend(members)
    array = ", ".join(values + ["0"])    # the 0: never an empty array
    out += ['cdef extern from *:', '    """', '    #include "ggml.h"',
            f"    static const long long pg_enum_values[] = {{{array}}};", '    """',
            "    const long long pg_enum_values[]", "",
            "cdef list _enum_members(tuple names, Py_ssize_t start):",
            "    return [(name, pg_enum_values[start + i]) for i, name in enumerate(names)]", ""]
    return "\n".join(out + lists) + "\n"


def gen_core_stub(template: str, enums: dict[str, list[str]]) -> str:
    """pyggml/_core.pyi.in with ggml's enum members of this header filled in."""
    out = []
    for cenum, (cls, prefix) in ENUM_CLASSES.items():
        members = [m for m in enums.get(cenum, []) if m.startswith(prefix) and not m.endswith("_COUNT")]
        out.append(f"class {cls}(IntEnum):")
        out.extend(f"    {m[len(prefix):]} = ..." for m in members)
        if not members:     # an enum this ggml lacks (OpHint before 0.17): an empty class
            out.append("    ...")
        if cls == "Type":   # the properties of _core._TypeBase
            out.append(template[template.index("    @property"):template.index("# @TYPEPROPS_END@")].rstrip())
        out.append("")
    base = template[template.index("class _TypeBase"):template.index("# @TYPEPROPS_END@")]
    base += "# @TYPEPROPS_END@\n"
    return template.replace(base, "").replace("# @ENUMS@\n", "\n".join(out))


def write_if_changed(path: str, text: str) -> None:
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)


def defect_symbol(defect_id: str) -> str:
    """The C symbol of a pyggml.defects id: "fab-batch-gqa-oob" -> PG_DEFECT_FAB_BATCH_GQA_OOB"""
    return "PG_DEFECT_" + defect_id.upper().replace("-", "_")


def gen_defects_header(path: str) -> str:
    """pyggml_defects.h: one symbol per record of pyggml/defects.py, so that a kernel rule
    names a defect by a symbol the compiler checks (a misspelt id does not compile). The
    module is loaded from its file (load_defects)."""
    mod = load_defects(path)
    lines = ["/* generated by pyggml/_gen_ops.py from pyggml/defects.py: the ids of the known",
             " * upstream defects, for pg_why.defect and the other C code that names one */",
             "#pragma once", ""]
    for d in mod.DEFECTS:
        lines.append(f'#define {defect_symbol(d.id)} "{d.id}"')
    return "\n".join(lines) + "\n"


def check_prechecks(ops: list[Op], path: str) -> None:
    """Every check=NAME flag names a function of pyggml/_prechecks.py."""
    text = open(path).read() if os.path.exists(path) else ""
    for op in ops:
        for flag in op.flags:
            if flag.startswith("check=") and f"\ndef {flag[6:]}(" not in text:
                raise TableError(f"line {op.line}: {op.name}: {flag}: no such function in {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops.txt"))
    ap.add_argument("--header", required=True, help="the ggml.h pyggml is built against")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--strict", action="store_true",
                    help="the pinned ggml: bind every row as declared (drift fails the build)")
    args = ap.parse_args(argv)
    try:
        ops = read_table(args.table)
        check_prechecks(ops, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_prechecks.py"))
    except TableError as e:
        print(f"_gen_ops: {e}", file=sys.stderr)
        return 2
    src = strip_c_comments(open(args.header).read())
    builders = header_builders(src)
    version = header_version(args.header)
    enums = header_enums(src)
    resolve(ops, builders, args.strict, enums, version)
    os.makedirs(args.out, exist_ok=True)
    h, c = gen_c(ops)
    families: dict[str, list[Op]] = {}
    for op in ops:
        families.setdefault(op.family, []).append(op)
    for fam, fops in families.items():
        write_if_changed(os.path.join(args.out, f"pyggml_ops_{fam}.h"), gen_family_header(fam, fops))
    write_if_changed(os.path.join(args.out, "pyggml_ops.h"), h)
    write_if_changed(os.path.join(args.out, "pyggml_ops.c"), c)
    bound_families = {f: [o for o in fops if o.bound] for f, fops in families.items()}
    bound_families = {f: fops for f, fops in bound_families.items() if fops}
    for fam, fops in bound_families.items():
        write_if_changed(os.path.join(args.out, f"_ops_{fam}.pyx"), gen_family(fam, fops))
        write_if_changed(os.path.join(args.out, f"_ops_{fam}.pyi"), gen_stub(fam, fops))
    write_if_changed(os.path.join(args.out, "_ops.py"), gen_ops_py(bound_families))
    write_if_changed(os.path.join(args.out, "_optable.py"), gen_optable(ops, builders, version, header_api(src)))
    write_if_changed(os.path.join(args.out, "enum_members.pxi"), gen_enum_pxi(enums))
    template = os.path.join(os.path.dirname(os.path.abspath(args.table)), "_core.pyi.in")
    with open(template) as f:
        write_if_changed(os.path.join(args.out, "_core.pyi"), gen_core_stub(f.read(), enums))
    here = os.path.dirname(os.path.abspath(__file__))
    write_if_changed(os.path.join(args.out, "pyggml_defects.h"),
                     gen_defects_header(os.path.join(here, "defects.py")))
    write_if_changed(os.path.join(args.out, "ops_manifest.cmake"),
                     "set(PYGGML_OP_FAMILIES " + " ".join(bound_families) + ")\n")
    n_av = sum(op.available for op in ops)
    print(f"_gen_ops: {len(ops)} rows, {n_av} available in this ggml.h ({version}{', strict' if args.strict else ''}), "
          f"{len(bound_families)} modules -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
