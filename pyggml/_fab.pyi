"""Type stubs for pyggml._fab."""

from pyggml._core import Tensor

def flash_attn_back_offsets(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int]: ...
def _probe_fab_batch_gqa_oob() -> int | None: ...
FAB_BATCH_GQA_OVERRUN: int | None
