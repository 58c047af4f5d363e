"""pyggml: Cython bindings to the ggml tensor library.

Names map one to one to ggml's C API without the ``ggml_`` prefix; ops are module
functions taking the context first, so C translates line for line::

    ctx = pyggml.Context(16 * 2**20)            // ggml_init(...)
    a = ctx.new_tensor(pyggml.Type.F32, (4,))   // ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    c = pyggml.add(ctx, a, b)                   // ggml_add(ctx, a, b)

Where things live: ``pyggml/ops.txt`` (the op table: every builder, generated into
``pyggml._ops_<family>``), ``_core`` (Context, Tensor, argument checks),
``_graph`` (Graph), ``_cpu`` (the CPU executor), ``_fab`` (the FLASH_ATTN_BACK
node's offsets and defect probe; its builder is ``csrc/fab_node.c``), ``csrc/`` (the C runtime: abort guard, forked dry run, kernel rules),
``errors`` (exceptions), ``defects`` (known upstream defects).
"""

try:
    from pyggml import _core  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on how pyggml is run
    import os as _os

    _here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(_here, "_core.pyx")):
        raise ImportError(
            f"pyggml is being imported from its source tree ({_here}), which has no compiled "
            "extension. Install it (`pip install .`) and run Python from another directory, "
            "or use the `pyggml` command."
        ) from _e
    raise

from importlib.metadata import PackageNotFoundError as _NotFound
from importlib.metadata import version as _version

from pyggml._core import (
    DEFAULT_GRAPH_SIZE,
    MAX_DIMS,
    MAX_NAME,
    MAX_SRC,
    MEM_ALIGN,
    Context,
    GluOp,
    Op,
    OpHint,
    RopeType,
    OpPool,
    Prec,
    ScaleFlag,
    ScaleMode,
    SortOrder,
    Storage,
    Tensor,
    TriType,
    Type,
    UnaryOp,
    build_info,
    dequantize,
    flash_attn_ext_set_prec,
    flash_attn_ext_set_n_kv_max,
    flash_attn_ext_add_sinks,
    soft_max_add_sinks,
    prec_set_acc,
    prec_set_src,
    ggml_version,
    graph_overhead,
    mul_mat_set_hint,
    mul_mat_set_prec,
    rope_set_offset,
    quantize,
    tensor_overhead,
    set_input,
    set_loss,
    set_output,
    set_param,
)
from pyggml._graph import Graph
from pyggml._cpu import DEFAULT_N_THREADS, CpuExecutor, proof_timeout, set_proof_timeout
from pyggml._fab import flash_attn_back_offsets
from pyggml._backend import Backend, GraphAllocator, Scheduler, backends, compare_graph_backend, rpc_protocol
from pyggml._ops import *  # noqa: F401,F403  (every bound graph builder, from pyggml/ops.txt)
from pyggml._ops import __all__ as _op_names
from pyggml.errors import (
    ArgumentError,
    ComputeError,
    ContextClosedError,
    ContextFullError,
    ExportError,
    GGMLAbort,
    GGMLError,
    GGMLTypeError,
    GGMLVersionError,
    GGUFError,
    GraphBusyError,
    GraphFullError,
    InternalError,
    InUseError,
    KernelPreconditionError,
    KernelTimeout,
    RPCError,
    UnsafeForkError,
    UnsupportedOpError,
    UpstreamDefect,
)
from pyggml.defects import known_defects
from pyggml.coverage import differentiable, op_coverage
from pyggml.attention import (
    attention_backward,
    attention_backward_node,
    flash_attn_back_grad_tensors,
    flash_attn_back_grads,
    flash_attn_ext_backward,
)
from pyggml import reference
from pyggml import rpc
from pyggml.rpc import RPCServer, rpc_server

try:
    __version__ = _version("pyggml")
except _NotFound:  # pragma: no cover - not installed (a source tree on sys.path)
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_GRAPH_SIZE", "DEFAULT_N_THREADS", "MAX_DIMS", "MAX_NAME", "MAX_SRC", "MEM_ALIGN",
    "Backend", "Context", "CpuExecutor", "Graph", "GraphAllocator", "Scheduler", "Storage", "Tensor", "backends",
    "compare_graph_backend", "rpc", "rpc_protocol", "rpc_server", "RPCServer",
    "GluOp", "Op", "OpHint", "OpPool", "Prec", "RopeType", "ScaleFlag", "ScaleMode", "SortOrder", "TriType", "Type", "UnaryOp",
    "ArgumentError", "ComputeError", "ContextClosedError", "ContextFullError", "ExportError", "GGMLAbort", "GGMLError",
    "KernelTimeout",
    "GGMLTypeError", "GGMLVersionError", "GGUFError", "GraphBusyError", "GraphFullError", "InternalError", "InUseError",
    "KernelPreconditionError",
    "RPCError", "UnsafeForkError", "UnsupportedOpError", "UpstreamDefect",
    "attention_backward", "attention_backward_node", "build_info", "flash_attn_back_grad_tensors",
    "flash_attn_back_grads", "flash_attn_back_offsets", "flash_attn_ext_backward", "flash_attn_ext_set_prec", "flash_attn_ext_set_n_kv_max", "flash_attn_ext_add_sinks", "soft_max_add_sinks", "prec_set_acc", "prec_set_src", "ggml_version", "graph_overhead", "tensor_overhead",
    "known_defects", "mul_mat_set_hint", "mul_mat_set_prec", "rope_set_offset", "op_coverage", "differentiable", "proof_timeout", "set_proof_timeout", "quantize", "dequantize", "reference", "set_input", "set_loss",
    "set_output", "set_param",
    *_op_names,
]
