# Included by _core.pyx: calls that may reach a server of ggml's RPC backend. ggml-rpc aborts
# the process when a connection fails and waits for ever for a server that does not answer;
# every such call goes through remote_call (csrc/remote.c says how), one place for the whole
# package: a Tensor's get/set here, a Backend's start, compute, allocations and frees in
# pyggml._backend.

from cpython.exc cimport PyErr_CheckSignals
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import socket

cdef extern from "Python.h":
    void * PyGILState_GetThisThreadState() nogil


cdef double _monotonic() noexcept nogil:
    # C's clock: a finalizer's free may run while the interpreter tears its modules down
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef int _runs_python() noexcept nogil:
    return PyGILState_GetThisThreadState() != NULL


pyggml_remote_set_thread_probe(_runs_python)

# the RPC servers this process talks to, by endpoint ("host:port"): ggml-rpc keeps one
# connection per endpoint for the life of the process, and so does this table
cdef dict _remotes = {}
# what the jobs given up were given (tensors, graphs, contexts): kept for good, since a
# job given up may still run (a server that answers late)
cdef list _given_up = []

DEFAULT_RPC_TIMEOUT_S = 60.0
cdef int _WAIT_SLICE_MS = 50


@cython.final
cdef class Remote:
    """One RPC server of this process (``endpoint``: "host:port"), shared by every Backend
    and buffer of it. ``timeout``: seconds a call may wait for the server (each call: a
    transfer, an allocation, a compute). ``dead``: None, or why the connection was given
    up (the server died or did not answer in time, or a wait was interrupted); after
    that every use of the endpoint raises RPCError, and what lies in its buffers is lost."""

    def __repr__(self):
        return f"<pyggml Remote {self.endpoint}{' given up' if self.dead is not None else ''}>"

    cdef int need_alive(self, str what) except -1:
        if self.dead is not None:
            raise RPCError(f"{what}: the connection to the RPC server at {self.endpoint} was given up ({self.dead}). "
                           f"ggml-rpc keeps one connection per endpoint for the life of the process, so this "
                           f"process cannot use {self.endpoint} again: start another server (another port), or "
                           f"use a new process", self.endpoint)
        return 0

    cdef bint accepts(self):
        """Whether the server's address takes a TCP connection now (a killed server's does not)."""
        host, _, port = self.endpoint.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except OSError:
            return False
        return True


cdef Remote remote_for(str endpoint):
    """The Remote of ``endpoint``, made on first use."""
    cdef Remote r = _remotes.get(endpoint)
    if r is None:
        r = Remote.__new__(Remote)
        r.endpoint = endpoint
        r.timeout = DEFAULT_RPC_TIMEOUT_S
        r.dead = None
        _remotes[endpoint] = r
    return r


cdef Remote remote_of_buffer(const void * buffer):
    """The Remote whose server holds ``buffer`` (a ggml_backend_buffer_t), or None: an
    RPC buffer's type is named "RPC<device>[<endpoint>]" by ggml-rpc."""
    if buffer == NULL:
        return None
    cdef const char * name = ggml_backend_buft_name(ggml_backend_buffer_get_type(<ggml_backend_buffer_t>buffer))
    if name == NULL or name[0] != b'R' or name[1] != b'P' or name[2] != b'C':
        return None
    s = name.decode(errors="replace")
    i = s.find("[")
    if i < 0 or not s.endswith("]"):
        return None
    return _remotes.get(s[i + 1:-1])


cdef void * remote_call(Remote r, pyggml_remote_fn fn, void * arg, size_t size, void * owned, object keep,
                        str what, bint quiet=False) except? NULL:
    """Run ``fn(arg)`` (``size`` bytes, copied in and, when it returns, back into ``arg``)
    on a worker thread, and wait for it in slices with the GIL released: Ctrl-C (unless
    ``quiet``: a finalizer's call), a fault of ggml-rpc's on the way (the server no longer
    takes connections) or ``r.timeout`` seconds give the job up: ``r`` is dead from then
    on, ``keep`` (what fn touches) stays alive for good, and RPCError (or the signal
    handler's exception) is raised. ``owned`` (malloc'ed memory fn uses, or NULL) is
    returned to the caller, who frees it, when the job returned; a job given up frees it
    if it ever returns. Returns ``owned``, or (void *) 1 where it is NULL."""
    cdef int err = 0, done = 0
    cdef char msg[PYGGML_MSG_CAP]
    cdef unsigned faults
    r.need_alive(what)
    faults = pyggml_remote_faults(NULL, 0)
    cdef pyggml_remote_job * job = pyggml_remote_start(fn, arg, size, owned, &err)
    if job == NULL:
        raise OSError(err, f"{what}: cannot start a worker thread")
    cdef double deadline = _monotonic() + r.timeout
    reason = None
    try:
        while True:
            with nogil:
                done = pyggml_remote_wait(job, _WAIT_SLICE_MS)
            if done:
                break
            if pyggml_remote_faults(NULL, 0) != faults:
                faults = pyggml_remote_faults(msg, sizeof(msg))
                if not r.accepts():
                    reason = (f"ggml-rpc lost the connection: {msg.decode(errors='replace').strip()}; the server "
                              f"takes no connections any more")
                    break
            if _monotonic() > deadline:
                reason = f"the server did not answer within {r.timeout:g} s (the Backend's timeout)"
                break
            if not quiet:
                PyErr_CheckSignals()
    except BaseException:
        _give_up(r, job, keep, "a wait for the server was interrupted, leaving the connection in an unknown state")
        raise
    if reason is not None:
        _give_up(r, job, keep, reason)
        raise RPCError(f"{what}: {reason}. The connection to {r.endpoint} is given up: its Backends and "
                       f"buffers raise RPCError from now on", r.endpoint)
    pyggml_remote_finish(job, arg)
    return owned if owned != NULL else <void *>1


cdef int raise_remote_aborted(Remote r, pyggml_guard * g, str where) except -1:
    """A call under the abort guard on remote_call's worker aborted: where it was
    ggml-rpc's own abort (a connection that failed, in a ggml whose client sends on the
    calling thread: 0.20.2's), the connection is given up and RPCError raised; else as
    raise_aborted."""
    cdef bytes msg = g.message
    if r is not None and b"ggml-rpc" in msg:
        text = msg.decode(errors="replace").strip()
        if r.dead is None:
            r.dead = f"ggml-rpc lost the connection: {text}"
        raise RPCError(f"{where}: ggml-rpc lost the connection to {r.endpoint}: {text}. The connection is given "
                       f"up: its Backends and buffers raise RPCError from now on", r.endpoint)
    return raise_aborted(g, where, "")


cdef void _give_up(Remote r, pyggml_remote_job * job, object keep, str reason) noexcept:
    if r.dead is None:
        r.dead = reason
    _given_up.append(keep)
    pyggml_remote_abandon(job)


# --- the calls of this module ----------------------------------------------------------

cdef struct _TensorIO:
    ggml_tensor * t
    void * data
    size_t n
    bint get


cdef void _tensor_io(void * p) noexcept nogil:
    cdef _TensorIO * io = <_TensorIO *>p
    if io.get:
        ggml_backend_tensor_get(io.t, io.data, 0, io.n)
    else:
        ggml_backend_tensor_set(io.t, io.data, 0, io.n)


cdef int remote_tensor_io(Remote r, Tensor t, void * data, size_t n, bint get) except -1:
    """``get``: n bytes of t's data into ``data``; else from it. Through a buffer of the
    job's own (a job given up may still write or read it)."""
    cdef _TensorIO io
    cdef void * bounce = malloc(n if n else 1)
    if bounce == NULL:
        raise MemoryError(f"{'get' if get else 'set'}: {n} bytes")
    if not get:
        memcpy(bounce, data, n)
    io.t = t.ptr
    io.data = bounce
    io.n = n
    io.get = get
    bounce = remote_call(r, _tensor_io, &io, sizeof(io), bounce, (t, t.ctx), "get" if get else "set")
    if get:
        memcpy(data, bounce, n)
    free(bounce)
    return 0


cdef void _buffer_free(void * p) noexcept nogil:
    ggml_backend_buffer_free((<ggml_backend_buffer_t *>p)[0])


cdef void free_backend_buffer(void * buffer) noexcept:
    """ggml_backend_buffer_free, for a buffer of any backend. A buffer of an RPC server
    whose connection was given up is left as it is (its memory is the server's, and freeing
    it would wait for a server that cannot answer)."""
    cdef ggml_backend_buffer_t b = <ggml_backend_buffer_t>buffer
    cdef Remote r = remote_of_buffer(buffer)
    if r is None:
        ggml_backend_buffer_free(b)
        return
    if r.dead is not None:
        return
    try:
        remote_call(r, _buffer_free, &b, sizeof(b), NULL, None, "free a buffer", True)
    except BaseException:
        pass        # given up: the buffer stays


def rpc_remotes():
    """rpc_remotes() -> dict: endpoint -> None, or why its connection was given up: the
    RPC servers this process has talked to."""
    return {k: (<Remote>v).dead for k, v in _remotes.items()}
