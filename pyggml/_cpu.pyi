"""Type stubs for pyggml._cpu."""

from typing import final

from pyggml._graph import Graph

DEFAULT_N_THREADS: int

def _threadpool_busy() -> bool: ...
def _free_threadpool() -> None: ...
def prove(graph: Graph) -> None: ...

from pyggml._graph import Executor

@final
class CpuExecutor(Executor): ...
