# cython: language_level=3
"""pyggml._attn: pyggml's own blocked attention backward (csrc/attn_blocked.c), on numpy
arrays and as a node of a ggml graph (a ggml custom op, csrc/attn_node.c).

The kernel takes the FlashAttention-2 layout: tiles of queries and keys, the softmax
recomputed per tile from each row's log-sum-exp, dK and dV accumulated tile by tile, so
memory is linear in N and M. See :func:`pyggml.attention_backward` for the semantics;
these are the thin wrappers, whose arguments the Python layer has normalised.
"""

from libc.stdint cimport int64_t
from libc.string cimport memset

cimport numpy as cnp

from pyggml._ggml cimport *
from pyggml._rt cimport *
from pyggml._core cimport Context, Tensor, arg_tensor, arg_tensor_or_none, check_node_named, need_open
from pyggml._cpu cimport run_interruptibly

import statistics
import time

import numpy as np

from pyggml._cpu import DEFAULT_N_THREADS
from pyggml.errors import ArgumentError, GGMLTypeError, GGMLVersionError

cnp.import_array()

__all__ = ["ISAS", "WORK_PER_THREAD", "blocked_backward", "blocked_backward_node", "blocked_offsets", "default_threads",
           "fma_peak", "set_isa", "tile_rate"]


cdef int _need_array(object x, str name, int ndim) except -1:
    if not isinstance(x, np.ndarray):
        raise GGMLTypeError(f"{name} must be a numpy.ndarray, not {type(x).__name__}")
    if x.dtype != np.float32:
        raise GGMLTypeError(f"{name} must be float32, not {x.dtype}")
    if x.ndim != ndim or not x.flags.c_contiguous or not x.flags.aligned:
        raise ArgumentError(f"{name} must be an aligned C-contiguous {ndim}-d array, got shape {x.shape}")
    return 0


# A default thread count gives every thread at least this much of B*H*N*M*D (half of it
# when masked): the kernel starts and joins its pthreads on every call, which costs more
# than a second thread saves below that (measured on a Zen 3, 1 head, D=64, masked: N=128,
# 0.5 * 2**20, 0.88x on 2 threads; N=256, 2 * 2**20, 1.27x).
WORK_PER_THREAD = 1 << 20


def default_threads(B, H, N, M, D, masked):
    """default_threads(B, H, N, M, D, masked) -> int: the threads ``blocked_backward``
    uses when not told: those this process may use, fewer for small problems (one per
    ``WORK_PER_THREAD`` of B*H*N*M*D, half of it when masked). The bits do not depend on it."""
    cdef double work = <double>B * H * N * M * D * (0.5 if masked else 1.0)
    return <int>max(1, min(DEFAULT_N_THREADS, work // WORK_PER_THREAD))


cdef int _threads(object n_threads, object shape=None) except -1:
    """The kernel's own pthreads (not OpenMP: fine in a forked child too); by default
    default_threads(*shape)."""
    if n_threads is None:
        return DEFAULT_N_THREADS if shape is None else default_threads(*shape)
    if type(n_threads) is not int or not 1 <= n_threads <= 512:
        raise ArgumentError(f"n_threads must be an int in [1, 512], got {n_threads!r}")
    return n_threads


cdef int _need_flags(object masked, object grouping) except -1:
    if type(masked) is not bool:
        raise GGMLTypeError(f"masked must be a bool, not {masked!r}")
    if grouping not in (0, 1) or type(grouping) not in (int, bool):
        raise ArgumentError(f"grouping must be 0 (h % KVH) or 1 (h // (H / KVH)), not {grouping!r}")
    return 0


cdef float _need_scale(object scale) except? -1:
    s = float(scale)
    if not np.isfinite(s) or s == 0.0 or not np.isfinite(np.float32(s)):
        raise ArgumentError(f"scale must be finite and non-zero (in float32), got {scale!r}")
    return <float>s


cdef struct _AttnRun:
    pyggml_attn_bwd a
    int n_threads
    int rc


cdef void _attn_task(void * arg, const int * abort) noexcept nogil:
    cdef _AttnRun * r = <_AttnRun *>arg
    r.a.cancel = abort          # Ctrl-C: every thread stops at its next key block
    r.rc = pyggml_attn_bwd_compute(&r.a, r.n_threads)


# problems of at least this many B*H*N*M*D run on a worker thread (about 10 ms and more)
cdef double _ASYNC_MIN_WORK = 1 << 24


cdef class _AttnState:
    """The kernel's arguments, alive (with the arrays they point into) until it is done."""
    cdef _AttnRun r


def blocked_backward(q, k, v, d, lse, o, scale, masked, grouping, n_threads):
    """blocked_backward(q, k, v, d, lse, o, scale, masked, grouping, n_threads) -> (dq, dk, dv)

    q, d, o: float32 C-contiguous ``(B, H, N, D)``; k, v: ``(B, KVH, M, D)``; lse
    ``(B, H, N)`` or None (with o). The kernel runs on a worker thread, the GIL
    released: Ctrl-C raises KeyboardInterrupt within 50 ms, and the kernel's threads stop
    at their next key block."""
    for name, x in (("q", q), ("k", k), ("v", v), ("d", d)):
        _need_array(x, name, 4)
    _need_flags(masked, grouping)
    cdef float sc = _need_scale(scale)
    B, H, N, D = q.shape
    KVH, M = k.shape[1], k.shape[2]
    cdef int nth = _threads(n_threads, (B, H, N, M, D, masked))
    if k.shape != v.shape or d.shape != q.shape:
        raise ArgumentError(f"v must have k's shape {k.shape} and d q's {q.shape}")
    if k.shape[0] != B or k.shape[3] != D:
        raise ArgumentError(f"k {k.shape} must match q {q.shape} in batch and head size")
    if min(B, H, N, D, KVH, M) < 1 or H % KVH:
        raise ArgumentError(f"need non-empty q {q.shape}, k {k.shape} and H a multiple of KVH")
    if masked and M < N:
        raise ArgumentError(f"masked needs M={M} keys >= N={N} queries")
    if (lse is None) != (o is None):
        raise ArgumentError("lse and o come together (the saved statistics need the forward output)")
    if lse is not None:
        _need_array(lse, "lse", 3)
        _need_array(o, "o", 4)
        if lse.shape != (B, H, N) or o.shape != q.shape:
            raise ArgumentError(f"lse must be (B, H, N) = {(B, H, N)} and o q's shape, got {lse.shape}, {o.shape}")
    cdef cnp.ndarray dq = np.empty(q.shape, np.float32)
    cdef cnp.ndarray dk = np.empty(k.shape, np.float32)
    cdef cnp.ndarray dv = np.empty(v.shape, np.float32)
    cdef _AttnState state = _AttnState.__new__(_AttnState)
    memset(&state.r, 0, sizeof(state.r))
    cdef pyggml_attn_bwd * ap = &state.r.a
    ap.D, ap.N, ap.M, ap.H, ap.KVH, ap.B = D, N, M, H, KVH, B
    ap.scale = sc
    ap.masked = 1 if masked else 0
    ap.grouping = grouping
    ap.q = <const float *>cnp.PyArray_DATA(q)
    ap.k = <const float *>cnp.PyArray_DATA(k)
    ap.v = <const float *>cnp.PyArray_DATA(v)
    ap.d = <const float *>cnp.PyArray_DATA(d)
    if lse is not None:
        ap.lse = <const float *>cnp.PyArray_DATA(lse)
        ap.o = <const float *>cnp.PyArray_DATA(o)
    ap.dq = <float *>cnp.PyArray_DATA(dq)
    ap.dk = <float *>cnp.PyArray_DATA(dk)
    ap.dv = <float *>cnp.PyArray_DATA(dv)
    state.r.n_threads = nth
    cdef pyggml_async spec
    if <double>B * H * N * M * D < _ASYNC_MIN_WORK:
        with nogil:                      # a millisecond or less: no worker thread
            _attn_task(&state.r, NULL)
    else:
        memset(&spec, 0, sizeof(spec))
        spec.task = _attn_task
        spec.task_arg = &state.r
        run_interruptibly(&spec, NULL, NULL, NULL, 0, None, (state, q, k, v, d, lse, o, dq, dk, dv), None, NULL)
    cdef int rc = state.r.rc
    if rc == 2:
        raise MemoryError("blocked attention backward: no memory for its scratch")
    if rc == 3:
        raise RuntimeError("blocked attention backward: could not start its threads")
    if rc != 0:
        raise ArgumentError("blocked attention backward: arguments refused by the kernel")
    return dq, dk, dv


ISAS = {"auto": 0, "portable": 1, "avx2": 2, "avx512": 3}
_ISA_NAMES = {1: "portable", 2: "avx2", 3: "avx512"}


def set_isa(name):
    """set_isa(name) -> str: testing only: the code path of the kernel's inner loops,
    ``"auto"`` (the best this CPU has: AVX-512, AVX2+FMA, else portable C),
    ``"portable"``, ``"avx2"`` or ``"avx512"`` (each falls back where the CPU lacks it).
    Returns the path now in use. Not safe while another thread runs the kernel."""
    if name not in ISAS:
        raise ArgumentError(f"set_isa: name must be one of {', '.join(ISAS)}, not {name!r}")
    return _ISA_NAMES[pyggml_attn_bwd_set_isa(ISAS[name])]


def _set_panels(on):
    """_set_panels(on) -> bool: testing only: whether the kernel's group and head modes keep
    the statistics sweep's S and dP tiles for the backward (True, the default) or compute
    them again (False: the same bits, 14 N M D flops instead of 10). Returns the previous
    setting. Not safe while another thread runs the kernel."""
    return bool(pyggml_attn_bwd_set_panels(1 if on else 0))


def _set_start_elsewhere(on):
    """_set_start_elsewhere(on) -> bool: benchmarks only: whether the numpy call starts its
    helper threads on the CPUs other than the caller's current one (True, the default, on
    Linux) or where the scheduler puts them (False). The bits do not depend on it. Returns
    the previous setting. Not safe while another thread runs the kernel."""
    return bool(pyggml_attn_bwd_set_start_elsewhere(1 if on else 0))


def fma_peak(isa="auto", seconds=0.3, repeat=5):
    """fma_peak(isa="auto", seconds=0.3, repeat=5) -> float | None: one core's measured rate
    of fused multiply-adds, GFLOP/s per CPU-second of the calling thread (the median of
    ``repeat`` runs of about ``seconds / repeat`` each), on the vector path ``isa``
    (``"avx2"``: 8 floats, ``"avx512"``: 16; ``"auto"``: the path the blocked kernel uses).
    The ceiling the benchmarks put the kernels' rates against. None where the CPU or the
    build lacks the path (the portable path has no FMA peak of its own)."""
    if isa not in ISAS:
        raise ArgumentError(f"fma_peak: isa must be one of {', '.join(ISAS)}, not {isa!r}")
    _need_timing("fma_peak", seconds, repeat)
    return _rate(pyggml_attn_fma_flops, ISAS[isa], seconds, repeat)


def tile_rate(D, seconds=0.3, repeat=5):
    """tile_rate(D, seconds=0.3, repeat=5) -> float: GFLOP/s per CPU-second (nominal flops,
    the median of ``repeat`` runs) of the blocked kernel's five products of one 64 x 64
    tile step with saved statistics, head size ``D``, on buffers that stay in cache, with
    the code path in use (:func:`set_isa`): the rate its products reach where memory does
    not stand in their way, which the benchmarks put the whole kernel's rate against."""
    if not isinstance(D, int) or not 1 <= D <= 1024:
        raise ArgumentError(f"tile_rate: D must be an int in 1..1024, not {D!r}")
    _need_timing("tile_rate", seconds, repeat)
    rate = _rate(pyggml_attn_tile_flops, D, seconds, repeat)
    if rate is None:
        raise MemoryError("tile_rate: no memory for the tile's buffers")
    return rate


def _need_timing(name, seconds, repeat):
    if not (seconds > 0 and repeat >= 1):
        raise ArgumentError(f"{name}: seconds must be > 0 and repeat >= 1, not {seconds!r}, {repeat!r}")


ctypedef double (*flops_fn)(int, long) noexcept nogil


cdef object _rate(flops_fn fn, int arg, double seconds, int repeat):
    """GFLOP/s of fn(arg, iters) per CPU-second of this thread, the median of ``repeat``
    runs of about seconds / repeat each; None where fn says -1 (no such path)."""
    cdef long iters = 1
    cdef double flops
    cdef double t0
    with nogil:
        flops = fn(arg, 1)
    if flops < 0:
        return None
    per_run = seconds / repeat
    while True:                     # calibrate: a run of at least per_run CPU-seconds
        t0 = time.thread_time()
        with nogil:
            flops = fn(arg, iters)
        dt = time.thread_time() - t0
        if dt >= per_run or iters > (1 << 40):
            break
        iters *= 2 if dt <= 0 else max(2, min(64, int(per_run / dt * 1.2) + 1))
    rates = []
    for _ in range(repeat):
        t0 = time.thread_time()
        with nogil:
            flops = fn(arg, iters)
        rates.append(flops / max(time.thread_time() - t0, 1e-9) / 1e9)
    return float(statistics.median(rates))


def blocked_offsets(q, k):
    """blocked_offsets(q, k) -> (offs_q, offs_k, offs_v, end): byte offsets of dq, dk and
    dv in the result of :func:`blocked_backward_node`, and where dv's padding ends (a
    scratch follows where the node is two)."""
    cdef Tensor tq = arg_tensor(q, "q", "blocked_offsets")
    cdef Tensor tk = arg_tensor(k, "k", "blocked_offsets")
    cdef int64_t offs[4]
    pyggml_attn_bwd_offsets(tq.ptr, tk.ptr, offs)
    return tuple(4 * offs[i] for i in range(4))


def blocked_backward_node(Context ctx, q, k, v, d, scale, masked, grouping, lse=None, o=None):
    """blocked_backward_node(ctx, q, k, v, d, scale, masked, grouping, lse=None, o=None) -> Tensor

    The kernel as a node of a ggml graph: a GGML_OP_CUSTOM node over q [D,N,H,B],
    k, v [D,M,KVH,B], d [D,N,H,B] (ggml order, F32, contiguous) and optionally lse
    [N,H,B] and o [D,N,H,B]. Its 1-D F32 result packs dq, dk and dv at the byte
    offsets of :func:`blocked_offsets`. ggml's compute threads run it. Where they must
    meet (fewer than 4 query heads in all, or grouped queries over fewer than 4 (batch,
    kv head) pairs) the node is two, and this is the second: an in-place view of the
    first that reduces what the first's threads left in the scratch after dv."""
    need_open(ctx, "attention_backward_node")
    if not PYGGML_HAVE_CUSTOM_4D:
        raise GGMLVersionError("attention_backward_node: this ggml has no ggml_custom_4d")
    cdef str op = "attention_backward_node"
    cdef Tensor tq = arg_tensor(q, "q", op), tk = arg_tensor(k, "k", op)
    cdef Tensor tv = arg_tensor(v, "v", op), td = arg_tensor(d, "d", op)
    cdef Tensor tl = arg_tensor_or_none(lse, "lse", op), to = arg_tensor_or_none(o, "o", op)
    _need_flags(masked, grouping)
    cdef float sc = _need_scale(scale)
    srcs = (tq, tk, tv, td) + ((tl, to) if tl is not None or to is not None else ())
    names = ("q", "k", "v", "d", "lse", "o")[:len(srcs)]
    if (tl is None) != (to is None):
        raise ArgumentError(f"{op}: lse and o come together (the saved statistics need the forward output)")
    cdef ggml_tensor * ptrs[6]
    cdef int i, n = len(srcs)
    for i in range(n):
        ptrs[i] = (<Tensor>srcs[i]).ptr
    cdef ggml_tensor probe
    pyggml_attn_bwd_probe(&probe, ptrs, n, sc, 1 if masked else 0, grouping)
    check_node_named(&probe, op, names, srcs)
    nbytes = 4 * probe.ne[0]
    ctx._reserve(pyggml_attn_bwd_node_count(ptrs, n) * ggml_tensor_overhead() + nbytes + GGML_MEM_ALIGN, op)
    cdef ggml_tensor * result = pyggml_attn_bwd_node(ctx.ptr, ptrs, n, sc, 1 if masked else 0, grouping)
    if result == NULL:
        raise GGMLVersionError(f"{op}: this ggml has no ggml_custom_4d")
    return ctx._adopt(result, srcs)
