"""pyggml: Cython bindings to the ggml tensor library.

Names map one to one to ggml's C API without the ``ggml_`` prefix; ops are
module functions taking the context first, so C translates line for line::

    ctx = pyggml.Context(16 * 2**20)            // ggml_init(...)
    a = ctx.new_tensor(pyggml.Type.F32, (4,))   // ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    c = pyggml.add(ctx, a, b)                   // ggml_add(ctx, a, b)
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

from pyggml._core import (
    DEFAULT_GRAPH_SIZE,
    DEFAULT_N_THREADS,
    MAX_DIMS,
    MAX_NAME,
    MEM_ALIGN,
    UPSTREAM_DEFECT_FAB_BATCH_GQA,
    Context,
    Graph,
    Tensor,
    Type,
    add,
    build_info,
    cont,
    cpy,
    diag_mask_inf,
    div,
    flash_attn_back,
    flash_attn_back_offsets,
    ggml_version,
    mean,
    mul,
    mul_mat,
    permute,
    repeat,
    reshape,
    reshape_1d,
    reshape_2d,
    reshape_3d,
    reshape_4d,
    scale,
    set_loss,
    set_param,
    soft_max,
    sqr,
    sqrt,
    sub,
    sum,
    transpose,
    view_1d,
    view_2d,
    view_3d,
    view_4d,
)

from pyggml.attention import (
    attention_backward,
    flash_attn_back_grad_tensors,
    flash_attn_back_grads,
)
from pyggml import reference

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_GRAPH_SIZE", "DEFAULT_N_THREADS", "MAX_DIMS", "MAX_NAME", "MEM_ALIGN",
    "UPSTREAM_DEFECT_FAB_BATCH_GQA",
    "Context", "Graph", "Tensor", "Type",
    "add", "attention_backward", "build_info", "flash_attn_back", "flash_attn_back_grad_tensors",
    "flash_attn_back_grads", "flash_attn_back_offsets", "reference", "cont", "cpy", "diag_mask_inf", "div", "ggml_version", "mean",
    "mul", "mul_mat", "permute", "repeat", "reshape", "reshape_1d", "reshape_2d",
    "reshape_3d", "reshape_4d", "scale", "set_loss", "set_param", "soft_max", "sqr", "sqrt", "sub", "sum",
    "transpose", "view_1d", "view_2d", "view_3d", "view_4d",
]
