"""pyggml's exceptions.

Every class derives from :class:`GGMLError` and from the builtin exception that a
caller of a Python library would expect, so ``except ValueError`` keeps working and
``except pyggml.GGMLError`` catches everything pyggml raises on purpose::

    GGMLError
    ├── ArgumentError (ValueError)          a bad value: shape, stride, range, state
    │   ├── ContextClosedError              a tensor or graph used after its context closed
    │   ├── GraphFullError                  more nodes or leafs than the graph's size
    │   └── KernelPreconditionError         the CPU kernel would abort or misread this node
    ├── GGMLTypeError (TypeError)           a wrong Python type, or a ggml type the op does not take
    ├── ContextFullError (MemoryError)      the result would not fit its context
    ├── ExportError (BufferError)           no zero-copy array of this tensor: quantized, BF16, device memory
    ├── GGMLAbort (ValueError)              ggml itself would abort: .ggml_message is its message
    │   └── KernelTimeout                   a proof's child ran past its time: the kernel hangs (or is slow)
    ├── UpstreamDefect (ValueError)         refused for a known ggml defect: .defect is its id
    ├── GGMLVersionError (NotImplementedError)  the linked ggml lacks this op or feature
    ├── GGUFError (ValueError)              a GGUF file ggml's reader refuses, or whose tensors lie outside it
    ├── UnsupportedOpError (NotImplementedError)  a backend cannot compute this node, or ggml cannot differentiate it
    ├── InUseError (RuntimeError)           close() or re-entry of what a compute, scheduler or optimizer uses
    │   └── GraphBusyError                  another thread computes (or builds) this graph
    ├── UnsafeForkError (RuntimeError)      threads requested where a fork left OpenMP unusable
    ├── ComputeError (RuntimeError)         ggml_graph_compute returned a failure status
    ├── RPCError (ConnectionError)          an RPC server unreachable, of another protocol, dead or silent
    └── InternalError (RuntimeError)        pyggml broke one of its own invariants: please report

No code in pyggml tells errors apart by their text: it catches these classes.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError", "ComputeError", "ContextClosedError", "ContextFullError", "ExportError", "GGMLAbort",
    "GGMLError", "GGMLTypeError", "GGMLVersionError", "GGUFError", "GraphBusyError", "GraphFullError", "InUseError",
    "InternalError", "KernelPreconditionError", "KernelTimeout", "RPCError", "UnsafeForkError", "UnsupportedOpError",
    "UpstreamDefect",
]


class GGMLError(Exception):
    """Root of the exceptions pyggml raises."""


class ArgumentError(GGMLError, ValueError):
    """An argument has a bad value (shape, stride, range) or is in a bad state."""


class ContextClosedError(ArgumentError):
    """A tensor, graph or context was used after its context was closed."""


class GraphFullError(ArgumentError):
    """A graph would hold more nodes or leafs than its ``size``."""


class KernelPreconditionError(ArgumentError):
    """The CPU kernel of a node would abort (or read the wrong memory) on its layout or
    parameters, although ggml's builder accepts it. ``.op`` is the node's op name."""

    def __init__(self, message: str, op: str = ""):
        super().__init__(message)
        self.op = op


class GGMLTypeError(GGMLError, TypeError):
    """An argument has the wrong Python type, or a ggml type the op's kernel does not take."""


class ContextFullError(GGMLError, MemoryError):
    """The tensors (or graph) an operation creates would not fit in their context."""


class ExportError(GGMLError, BufferError):
    """The array protocols (``np.asarray``, ``__dlpack__``) cannot hand out this tensor's
    memory as it is: a quantized type (no element dtype: see ``Tensor.blocks``), BF16 (numpy
    has no dtype for it: ``Tensor.numpy`` shows its bits as uint16), memory that is not the
    host's, or no data yet. A ``BufferError``, as the DLPack protocol asks of a producer."""


class GGMLAbort(GGMLError, ValueError):
    """ggml would abort (a failed ``GGML_ASSERT``) on these arguments.

    pyggml runs the call where an abort cannot end the process (a scratch context under
    an abort guard, or a forked child) and raises this instead; ``.ggml_message`` is
    ggml's own message, e.g. ``"ggml.c:2130: GGML_ASSERT(ggml_can_repeat(b, a)) failed"``.
    """

    def __init__(self, message: str, ggml_message: str = ""):
        super().__init__(message)
        self.ggml_message = ggml_message


class KernelTimeout(GGMLAbort):
    """A forked proof's child computed past its time limit and was killed: a kernel that
    never returns on this node (such as a loop whose step is zero), or one far slower than
    the proof allows. ``.seconds`` is the limit it ran past."""

    def __init__(self, message: str, ggml_message: str = "", seconds: float = 0.0):
        super().__init__(message, ggml_message)
        self.seconds = seconds


class UpstreamDefect(GGMLError, ValueError):
    """Refused because ggml has a known defect on this input. ``.defect`` is the id of its
    record in :mod:`pyggml.defects` (``pyggml.known_defects()``)."""

    def __init__(self, message: str, defect: str = ""):
        super().__init__(message)
        self.defect = defect


class GGMLVersionError(GGMLError, NotImplementedError):
    """The linked ggml lacks this op or feature (too old, or changed its signature)."""


class GGUFError(GGMLError, ValueError):
    """A GGUF file that ggml's reader refuses (wrong magic, a truncated header, an unknown
    type, inconsistent offsets: the message quotes what ggml logged), or whose tensor data
    lies past the end of the file."""


class UnsupportedOpError(GGMLError, NotImplementedError):
    """A backend cannot compute a node of the graph (``ggml_backend_supports_op`` is
    false; ggml's backends abort on such a node), or ggml's backward pass has no gradient
    for it (``build_backward_expand``; ``pyggml.differentiable``). ``.op`` is the node's op
    name (``"UNARY:TANH"``), ``.node`` its tensor name, ``.backend`` the backend's ("" for
    the backward pass)."""

    def __init__(self, message: str, op: str = "", node: str = "", backend: str = ""):
        super().__init__(message)
        self.op, self.node, self.backend = op, node, backend


class InUseError(GGMLError, RuntimeError):
    """The object is in use: a compute runs on it (a Backend during a compute, a Context
    whose graphs an Optimizer's epoch runs), a Scheduler or an Optimizer holds it, or it
    was re-entered from a callback of its own compute (``Optimizer.epoch`` from its
    callback). ``close()`` and the re-entrant call raise this instead of freeing memory
    under the compute, or deadlocking."""


class GraphBusyError(InUseError):
    """The graph is being computed (or changed) by another thread."""


class UnsafeForkError(GGMLError, RuntimeError):
    """A multi-threaded compute asked for in a process forked after OpenMP threads ran in
    its parent, where libgomp cannot start threads (it would hang)."""


class ComputeError(GGMLError, RuntimeError):
    """``ggml_graph_compute`` returned a failure status (``.status``: ggml's name for it)."""

    def __init__(self, message: str, status: str = ""):
        super().__init__(message)
        self.status = status


class RPCError(GGMLError, ConnectionError):
    """A call to a server of ggml's RPC backend failed: the server could not be reached,
    speaks another protocol, closed the connection, or did not answer within the time
    limit (``.endpoint``: its "host:port"). ggml-rpc itself would abort the process or
    wait for ever; pyggml gives the connection up instead, and every later use of it
    raises this too."""

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint


class InternalError(GGMLError, RuntimeError):
    """pyggml found one of its own invariants broken (ggml failed after pyggml's checks
    passed, a node of no known context, a size that disagrees with itself): a bug in
    pyggml or a ggml it does not know. The message says what; please report it."""
