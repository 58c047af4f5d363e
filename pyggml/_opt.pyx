# cython: language_level=3
"""pyggml._opt: training with ggml-opt (ggml-opt.h) over ggml's scheduler.

An Optimizer trains over a :class:`pyggml.Scheduler` (``ggml_backend_sched``); a
:class:`Dataset` holds data points and labels in host memory (numpy views); an
:class:`Optimizer` is ``ggml_opt_init`` with static graphs for a model whose forward
graph maps ``inputs`` ([ne_datapoint, batch]) to ``outputs`` ([ne_label, batch]):
``epoch()`` runs ``ggml_opt_epoch`` (the GIL released; a Python callback after each
batch). :func:`pyggml.opt.fit` is the loop over epochs.

ggml-opt aborts the process on what it cannot do. pyggml checks the arguments it can
(shapes, types, parameter values, the forward graph as Graph.build_backward_expand
does) and then proves the rest once: ``ggml_opt_init``, an allocation and one training
batch run first in a forked child, whose abort becomes :class:`~pyggml.GGMLAbort`. Over a
scheduler with an RPC backend (whose server a forked child cannot reach) ggml-opt's calls
run instead under the abort guard on remote_call's worker (pyggml._core), with the
server's time limit; an abort there, or a connection given up, leaves the Optimizer
unusable.
"""

cimport cython
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int32_t, int64_t, uintptr_t
cimport numpy as cnp

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport *
from pyggml._ggml_opt cimport *
from pyggml._rt cimport *
from libc.string cimport memset

from pyggml._core cimport Context, Remote, Tensor, need_open, raise_remote_aborted, raise_status, remote_call
from pyggml._backend cimport Backend, Scheduler, lock_backends, set_callback_holds, unlock_backends
from pyggml._cpu cimport _need_threads, note_threads, proof_limit, run_interruptibly
from pyggml._graph cimport Graph

import threading

import numpy as np

from pyggml._core import Type
from pyggml.errors import (ArgumentError, ContextClosedError, ContextFullError, GGMLAbort, InUseError,
                           UpstreamDefect)

cnp.import_array()

__all__ = ["Dataset", "Optimizer", "Result", "LOSSES", "OPTIMIZERS"]

LOSSES = {"mean": GGML_OPT_LOSS_TYPE_MEAN, "sum": GGML_OPT_LOSS_TYPE_SUM,
          "cross_entropy": GGML_OPT_LOSS_TYPE_CROSS_ENTROPY, "mse": GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR}
OPTIMIZERS = {"adamw": GGML_OPT_OPTIMIZER_TYPE_ADAMW, "sgd": GGML_OPT_OPTIMIZER_TYPE_SGD}
DEFAULTS = {"adamw": {"alpha": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "wd": 0.0},
            "sgd": {"alpha": 1e-3, "wd": 0.0}}
@cython.final
cdef class Dataset:
    """Dataset(ndata, ne_datapoint, ne_label=0, type_data=Type.F32, type_label=Type.F32, ndata_shard=1)

    ``ggml_opt_dataset``: ``ndata`` data points of ``ne_datapoint`` values and labels of
    ``ne_label`` values, in host memory; fill them through the numpy views :attr:`data`
    (ndata, ne_datapoint) and :attr:`labels` (ndata, ne_label). Shuffling moves whole
    shards of ``ndata_shard`` points."""

    cdef ggml_opt_dataset_t ptr
    cdef readonly int64_t ndata, ne_datapoint, ne_label, ndata_shard
    cdef readonly object type_data, type_label

    def __cinit__(self, ndata, ne_datapoint, ne_label=0, type_data=Type.F32, type_label=Type.F32, ndata_shard=1):
        self.ptr = NULL
        for name, v, lo in (("ndata", ndata, 1), ("ne_datapoint", ne_datapoint, 1), ("ne_label", ne_label, 0),
                            ("ndata_shard", ndata_shard, 1)):
            if type(v) is not int or not lo <= v < (1 << 40):
                raise ArgumentError(f"Dataset: {name} must be an int >= {lo}, got {v!r}")
        if ndata % ndata_shard:
            raise ArgumentError(f"Dataset: ndata ({ndata}) must be a multiple of ndata_shard ({ndata_shard})")
        for name, t in (("type_data", type_data), ("type_label", type_label)):
            if t not in (Type.F32, Type.F16, Type.I32):
                raise ArgumentError(f"Dataset: {name} must be Type.F32, F16 or I32, got {t!r}")
        self.ndata, self.ne_datapoint, self.ne_label, self.ndata_shard = ndata, ne_datapoint, ne_label, ndata_shard
        self.type_data, self.type_label = Type(type_data), Type(type_label)
        self.ptr = pyggml_opt_dataset_init_nothrow(<ggml_type><int>type_data, <ggml_type><int>type_label,
                                                   ne_datapoint, ne_label, ndata, ndata_shard)
        # ggml_opt_dataset_init does not check its buffer's allocation: a dataset too large
        # for memory comes back with tensors whose data is NULL
        if self.ptr != NULL and (ggml_opt_dataset_data(self.ptr).data == NULL or
                                 (ne_label > 0 and ggml_opt_dataset_labels(self.ptr).data == NULL)):
            ggml_opt_dataset_free(self.ptr)
            self.ptr = NULL
        if self.ptr == NULL:
            raise ContextFullError(f"Dataset: no memory for {ndata} points of {ne_datapoint} values and labels of "
                                   f"{ne_label}")

    def __dealloc__(self):
        if self.ptr != NULL:
            ggml_opt_dataset_free(self.ptr)
            self.ptr = NULL

    cdef object _view(self, ggml_tensor * t):
        cdef cnp.npy_intp dims[2]
        dims[0] = t.ne[1]
        dims[1] = t.ne[0]
        arr = cnp.PyArray_SimpleNewFromData(2, dims, {int(Type.F32): cnp.NPY_FLOAT32, int(Type.F16): cnp.NPY_FLOAT16,
                                                      int(Type.I32): cnp.NPY_INT32}[<int>t.type], t.data)
        Py_INCREF(self)
        cnp.PyArray_SetBaseObject(arr, self)
        return arr

    @property
    def data(self):
        """The data points, (ndata, ne_datapoint): a zero-copy, writable view."""
        return self._view(ggml_opt_dataset_data(self.ptr))

    @property
    def labels(self):
        """The labels, (ndata, ne_label): a zero-copy, writable view (None without labels)."""
        cdef ggml_tensor * t = ggml_opt_dataset_labels(self.ptr)
        return None if t == NULL else self._view(t)

    def __repr__(self):
        return f"<pyggml.Dataset {self.ndata} x {self.ne_datapoint} -> {self.ne_label}>"


class Result:
    """What an epoch's training or validation part gave: ``ndata`` data points, mean
    ``loss`` and its uncertainty, ``accuracy`` and its uncertainty (nan without labels),
    the predicted class of each point (``pred``)."""

    def __init__(self, ndata, loss, loss_unc, accuracy, accuracy_unc, pred):
        self.ndata, self.loss, self.loss_unc = ndata, loss, loss_unc
        self.accuracy, self.accuracy_unc, self.pred = accuracy, accuracy_unc, pred

    def __repr__(self):
        return f"<Result ndata={self.ndata} loss={self.loss:.4g} accuracy={self.accuracy:.4g}>"


cdef object _result(ggml_opt_result_t r):
    cdef int64_t n = 0
    cdef double loss = 0, lunc = 0, acc = 0, aunc = 0
    ggml_opt_result_ndata(r, &n)
    if n == 0:
        return Result(0, float("nan"), float("nan"), float("nan"), float("nan"), np.empty(0, np.int32))
    ggml_opt_result_loss(r, &loss, &lunc)
    ggml_opt_result_accuracy(r, &acc, &aunc)
    cdef cnp.ndarray pred = np.empty(n, np.int32)
    ggml_opt_result_pred(r, <int32_t *>cnp.PyArray_DATA(pred))
    return Result(int(n), loss, lunc, acc, aunc, pred)


# ggml-opt's epoch callback has no user data: the one epoch running at a time (a lock,
# held from the epoch's start until its worker thread is done) finds its Python callback
# here. The callback runs on that worker thread.
_epoch_lock = threading.Lock()
cdef object _callback = None
cdef object _callback_error = None
cdef tuple _epoch_backends = ()
cdef bint _epoch_cancelled = False       # the caller stopped waiting (Ctrl-C): call back no more
cdef long _callback_thread = 0           # the thread running the callback, while it runs


# An epoch over an RPC server runs on remote_call's worker, and may outlive a caller that
# gave it up: its thread carries its tag, and a batch of an epoch that is not the current
# one calls nobody back (the callback of a later epoch is not its).
cdef extern from *:
    """
    static _Thread_local unsigned long pyggml_opt_epoch_tag;
    """
    unsigned long pyggml_opt_epoch_tag

cdef unsigned long _current_tag = 0
cdef unsigned long _last_tag = 0


cdef void _on_batch(c_bool train, ggml_opt_context_t opt_ctx, ggml_opt_dataset_t dataset, ggml_opt_result_t result,
                    int64_t ibatch, int64_t ibatch_max, int64_t t_start_us) noexcept nogil:
    if pyggml_opt_epoch_tag != 0 and pyggml_opt_epoch_tag != _current_tag:
        return
    with gil:
        _call_back(train, result, ibatch, ibatch_max)


cdef void _call_back(bint train, ggml_opt_result_t result, int64_t ibatch, int64_t ibatch_max) noexcept:
    global _callback_error, _callback_thread
    if _callback is None or _callback_error is not None or _epoch_cancelled:
        return
    _callback_thread = threading.get_ident()
    set_callback_holds((_callback_thread, _epoch_backends))
    try:
        _callback(bool(train), int(ibatch), int(ibatch_max), _result(result))
    except BaseException as e:          # raised after the epoch: ggml cannot stop one midway
        _callback_error = e
    finally:
        set_callback_holds(None)
        _callback_thread = 0


class _between_epochs:
    """Hold the epoch lock for a call that changes ggml-opt's state (reset, shuffle): it
    waits for an epoch another thread runs; from an epoch's own callback it raises."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        if _callback_thread == threading.get_ident():
            raise InUseError(f"{self.what}: called from the callback of a running epoch: call it after the epoch")
        _epoch_lock.acquire()

    def __exit__(self, *exc):
        _epoch_lock.release()


@cython.final
cdef class _EpochState:
    """What one epoch's worker thread uses: alive until it is done."""
    cdef pyggml_epoch e

    def __dealloc__(self):
        if self.e.result_train != NULL:
            ggml_opt_result_free(self.e.result_train)
        if self.e.result_eval != NULL:
            ggml_opt_result_free(self.e.result_eval)


cdef void _end_epoch(tuple backends) noexcept:
    """The epoch's worker is done: give back its callback, its backends and the lock."""
    global _callback, _epoch_backends
    _callback = None
    _epoch_backends = ()
    unlock_backends(backends)
    _epoch_lock.release()


cdef struct _ProbeTask:
    pyggml_opt_probe probe
    double timeout_s
    pyggml_status status


cdef void _probe_task(void * p, const int * abort) noexcept nogil:
    cdef _ProbeTask * t = <_ProbeTask *>p
    pyggml_opt_dry_run(&t.probe, t.timeout_s, abort, &t.status)


@cython.final
cdef class _Probe:
    """The optimizer's forked dry run: its arguments and outcome, alive until its worker
    is done with them."""
    cdef _ProbeTask t


cdef struct _RemoteOpt:
    pyggml_guard g
    int what                    # 0 init, 1 epoch, 2 reset, 3 free
    int rc
    ggml_opt_params params
    ggml_opt_context_t opt
    pyggml_epoch * epoch
    unsigned long tag
    int optimizer


cdef void _remote_opt(void * p) noexcept nogil:
    cdef _RemoteOpt * r = <_RemoteOpt *>p
    if r.what == 0:
        r.rc = pyggml_try_opt_init(&r.g, r.params, &r.opt)
    elif r.what == 1:
        pyggml_opt_epoch_tag = r.tag
        r.rc = pyggml_try_opt_epoch(&r.g, r.epoch)
        pyggml_opt_epoch_tag = 0
    elif r.what == 2:
        r.rc = pyggml_try_opt_reset(&r.g, r.opt, r.optimizer)
    else:
        ggml_opt_free(r.opt)
        r.rc = 1


cdef Remote _remote_of_sched(Scheduler scheduler):
    cdef Backend b
    for b in scheduler.backends:
        if b.remote is not None:
            return b.remote
    return None


@cython.final
cdef class Optimizer:
    """Optimizer(scheduler, ctx_compute, inputs, outputs, loss="cross_entropy", optimizer="adamw", opt_period=1)

    ``ggml_opt_init`` with static graphs: ``outputs`` computed in ``ctx_compute`` (a
    ``no_alloc`` context, with room for the backward graphs) from ``inputs``
    ([ne_datapoint, batch], allocated, e.g. in a backend buffer) and the parameters
    (tensors marked with :func:`pyggml.set_param`, allocated). ``loss``: "mean", "sum",
    "cross_entropy" or "mse"; ``optimizer``: "adamw" or "sgd"; ``opt_period``: batches
    whose gradients accumulate per optimizer step."""

    cdef ggml_opt_context_t ptr
    cdef readonly Scheduler scheduler
    cdef readonly str loss, optimizer
    cdef ggml_opt_optimizer_params _params
    cdef Remote _remote               # the RPC server of the scheduler's (first) RPC backend, or None
    cdef str _given_up                # why it is unusable (an abort or a connection given up), or None
    cdef tuple _keep                  # the contexts the graphs live in: checked open before use
    cdef object _pools                # their pools: ggml-opt's graphs live there, whatever closes
    cdef Tensor _inputs, _outputs

    def __cinit__(self, Scheduler scheduler not None, Context ctx_compute not None, Tensor inputs not None,
                  Tensor outputs not None, loss="cross_entropy", optimizer="adamw", opt_period=1):
        self.ptr = NULL
        if loss not in LOSSES:
            raise ArgumentError(f"Optimizer: loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if optimizer not in OPTIMIZERS:
            raise ArgumentError(f"Optimizer: optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        if type(opt_period) is not int or not 1 <= opt_period < (1 << 30):
            raise ArgumentError(f"Optimizer: opt_period must be an int >= 1, got {opt_period!r}")
        need_open(ctx_compute, "Optimizer")
        inputs._check()
        outputs._check()
        cdef ggml_tensor * x = inputs.ptr
        cdef ggml_tensor * y = outputs.ptr
        if x.data == NULL:
            raise ArgumentError("Optimizer: inputs must be allocated (a backend buffer or a context pool): ggml-opt "
                                "copies each batch into it")
        if not ggml_is_contiguous(x) or x.ne[2] != 1 or x.ne[3] != 1:
            raise ArgumentError(f"Optimizer: inputs must be a contiguous [ne_datapoint, batch] matrix, got "
                                f"ne={inputs.ne}")
        if y.type != GGML_TYPE_F32 or y.ne[2] != 1 or y.ne[3] != 1 or y.ne[1] != x.ne[1]:
            raise ArgumentError(f"Optimizer: outputs must be an F32 [ne_label, batch] matrix with the inputs' batch "
                                f"({x.ne[1]}), got {Type(y.type).name} ne={outputs.ne}")
        # the forward graph, checked as Graph.build_backward_expand checks it
        cdef Graph g = Graph(ctx_compute, 2048)
        g.build_forward_expand(outputs)
        self._keep = tuple({ctx_compute, inputs.ctx, outputs.ctx} | (g._ctxs or set()))
        self._pools = frozenset(g._pools)
        _check_forward(g)
        self.scheduler = scheduler
        self.loss, self.optimizer = loss, optimizer
        self._inputs, self._outputs = inputs, outputs
        self._set_params(dict(DEFAULTS[optimizer]))
        cdef ggml_opt_params params = ggml_opt_default_params(scheduler.ptr, <ggml_opt_loss_type>LOSSES[loss])
        params.ctx_compute = ctx_compute.ptr
        params.inputs = x
        params.outputs = y
        params.opt_period = opt_period
        params.get_opt_pars = pyggml_opt_params_of
        params.get_opt_pars_ud = &self._params
        params.optimizer = <ggml_opt_optimizer_type>OPTIMIZERS[optimizer]
        # ggml_opt_init builds the backward and optimizer graphs in ctx_compute's pool, sized
        # by ggml (it checks the pool's size itself): the rest of the pool is its to use
        # (in ASan builds pyggml poisons the pool bytes no object was reserved for)
        ctx_compute._reserve(ctx_compute.mem_size - ggml_used_mem(ctx_compute.ptr), "Optimizer")
        self._remote = _remote_of_sched(scheduler)
        cdef _RemoteOpt r
        if self._remote is None:
            self._prove(params)
            with nogil:
                self.ptr = pyggml_opt_init_nothrow(params)
        else:
            for b in scheduler.backends:
                (<Backend>b)._need_open()
            memset(&r, 0, sizeof(r))
            r.what = 0
            r.params = params
            remote_call(self._remote, _remote_opt, &r, sizeof(r), NULL, (self, scheduler, ctx_compute, inputs,
                                                                           outputs, g), "Optimizer")
            if not r.rc:
                self._given_up = "ggml_opt_init aborted"
                raise_remote_aborted(self._remote, &r.g, "Optimizer (ggml-opt)")
            self.ptr = r.opt
        if self.ptr == NULL:
            raise ContextFullError("Optimizer: ggml_opt_init ran out of memory")

    cdef int _prove(self, ggml_opt_params params) except -1:
        """ggml_opt_init, an allocation and one batch in a forked child: its abort here."""
        probe_set = Dataset(int(self._inputs.ptr.ne[1]), int(self._inputs.ptr.ne[0]),
                            int(self._outputs.ptr.ne[0]) if self.loss in ("cross_entropy", "mse") else 0,
                            Type(self._inputs.ptr.type), Type.F32, 1)
        probe_set.data[...] = 0
        if probe_set.labels is not None:
            probe_set.labels[...] = 1.0 / probe_set.ne_label
        cdef _Probe probe = _Probe.__new__(_Probe)
        probe.t.probe.params = params
        probe.t.probe.dataset = (<Dataset>probe_set).ptr
        probe.t.probe.cpu = self.scheduler.cpu.ptr
        probe.t.timeout_s = proof_limit()
        pyggml_status_clear(&probe.t.status)
        cdef pyggml_async spec
        memset(&spec, 0, sizeof(spec))
        spec.task = _probe_task
        spec.task_arg = &probe.t
        # on a worker, so that Ctrl-C ends the wait (and the child) at once (_cpu._prove)
        run_interruptibly(&spec, NULL, NULL, NULL, 0, None, (probe, probe_set, self), None, NULL)
        return raise_status(&probe.t.status, "Optimizer (ggml-opt)")

    def __dealloc__(self):
        cdef _RemoteOpt r
        if self.ptr == NULL:
            return
        if self._remote is None:
            ggml_opt_free(self.ptr)
        elif self._given_up is None and self._remote.dead is None:
            # (given up: its buffers are the server's, and its state is not to be trusted)
            memset(&r, 0, sizeof(r))
            r.what = 3
            r.opt = self.ptr
            try:
                remote_call(self._remote, _remote_opt, &r, sizeof(r), NULL, None, "free", True)
            except BaseException:
                pass
        self.ptr = NULL

    def __repr__(self):
        return f"<pyggml.Optimizer {self.optimizer}, loss {self.loss}>"

    @property
    def batch_size(self):
        """Data points per batch: the inputs' ne[1]."""
        return int(self._inputs.ptr.ne[1])

    cdef int _check(self) except -1:
        if self.ptr == NULL:
            raise ArgumentError("Optimizer: not initialised")
        if self._given_up is not None:
            raise ArgumentError(f"Optimizer: unusable since {self._given_up}; make a new one")
        for c in self._keep:
            if (<Context>c).ptr == NULL:
                raise ContextClosedError("Optimizer: a context its graphs live in was closed")
        cdef Backend b
        for b in self.scheduler.backends:
            b._need_open()
        return 0

    cdef int _set_params(self, dict p) except -1:
        unknown = set(p) - set(DEFAULTS[self.optimizer])
        if unknown:
            raise ArgumentError(f"optimizer parameters: {self.optimizer} has no {', '.join(sorted(unknown))} "
                                f"(it has {', '.join(DEFAULTS[self.optimizer])})")
        v = dict(DEFAULTS[self.optimizer])
        for k, x in p.items():
            try:
                v[k] = float(x)
            except (TypeError, ValueError):
                raise ArgumentError(f"optimizer parameters: {k} must be a number, got {x!r}") from None
        # what ggml-opt asserts (a NaN fails every comparison, as in ggml)
        if not v["alpha"] > 0:
            raise ArgumentError(f"optimizer parameters: alpha must be > 0, got {v['alpha']}")
        if not 0 <= v["wd"] <= 1:
            raise ArgumentError(f"optimizer parameters: wd must be in [0, 1], got {v['wd']}")
        if self.optimizer == "adamw":
            for k in ("beta1", "beta2"):
                if not 0 <= v[k] <= 1:
                    raise ArgumentError(f"optimizer parameters: {k} must be in [0, 1], got {v[k]}")
            if not v["eps"] >= 0:
                raise ArgumentError(f"optimizer parameters: eps must be >= 0, got {v['eps']}")
            self._params.adamw.alpha, self._params.adamw.beta1, self._params.adamw.beta2 = (
                v["alpha"], v["beta1"], v["beta2"])
            self._params.adamw.eps, self._params.adamw.wd = v["eps"], v["wd"]
            self._params.sgd.alpha, self._params.sgd.wd = v["alpha"], v["wd"]
        else:
            self._params.sgd.alpha, self._params.sgd.wd = v["alpha"], v["wd"]
            self._params.adamw.alpha, self._params.adamw.beta1, self._params.adamw.beta2 = v["alpha"], 0.9, 0.999
            self._params.adamw.eps, self._params.adamw.wd = 1e-8, v["wd"]
        return 0

    def reset(self, optimizer=True):
        """reset(optimizer=True): gradients to zero; with ``optimizer`` also the
        optimizer's state (moments, step count)."""
        self._check()
        cdef _RemoteOpt r
        with _between_epochs("reset"):
            if self._remote is None:
                ggml_opt_reset(self.ptr, bool(optimizer))
                return
            memset(&r, 0, sizeof(r))
            r.what = 2
            r.opt = self.ptr
            r.optimizer = bool(optimizer)
            try:
                remote_call(self._remote, _remote_opt, &r, sizeof(r), NULL, (self,), "reset")
            except BaseException as e:
                self._given_up = f"its reset was given up ({type(e).__name__})"
                raise
            if not r.rc:
                self._given_up = "ggml_opt_reset aborted"
                raise_remote_aborted(self._remote, &r.g, "reset (ggml-opt)")

    def shuffle(self, Dataset dataset not None, idata=-1):
        """shuffle(dataset, idata=-1): shuffle the shards of the first ``idata`` points
        (all with -1) with the optimizer's random generator."""
        self._check()
        if type(idata) is not int or not (idata == -1 or 0 <= idata <= dataset.ndata):
            raise ArgumentError(f"shuffle: idata must be -1 or in [0, {dataset.ndata}], got {idata!r}")
        if idata >= 0 and idata % dataset.ndata_shard:
            raise ArgumentError(f"shuffle: idata must be a multiple of ndata_shard ({dataset.ndata_shard})")
        with _between_epochs("shuffle"):
            ggml_opt_dataset_shuffle(self.ptr, dataset.ptr, idata)

    def epoch(self, Dataset dataset not None, idata_split=-1, params=None, callback=None):
        """epoch(dataset, idata_split=-1, params=None, callback=None) -> (train, val)

        One pass over ``dataset`` (``ggml_opt_epoch``): the first ``idata_split``
        points (all with -1) train, the rest validate. ``params``: the optimizer's
        parameters for this epoch (a dict: alpha, beta1, beta2, eps, wd for AdamW;
        alpha, wd for SGD; defaults for what is missing). ``callback(train, ibatch,
        ibatch_max, result)`` runs after each batch. Returns two :class:`Result`."""
        global _callback, _callback_error
        self._check()
        cdef ggml_tensor * x = self._inputs.ptr
        cdef ggml_tensor * y = self._outputs.ptr
        if dataset.ne_datapoint != x.ne[0] or Type(x.type) != dataset.type_data:
            raise ArgumentError(f"epoch: the dataset's points ({dataset.ne_datapoint} x {dataset.type_data.name}) "
                                f"do not fit the inputs ({x.ne[0]} x {Type(x.type).name})")
        needs_labels = self.loss in ("cross_entropy", "mse")
        if needs_labels and (dataset.ne_label != y.ne[0] or dataset.type_label != Type.F32):
            raise ArgumentError(f"epoch: loss {self.loss} needs F32 labels of {y.ne[0]} values (the outputs'), the "
                                f"dataset has {dataset.ne_label} x {dataset.type_label.name}")
        if not needs_labels and dataset.ne_label != 0:
            raise ArgumentError(f"epoch: loss {self.loss} takes no labels; make the dataset with ne_label=0")
        batch = x.ne[1]
        if dataset.ndata % batch or batch % dataset.ndata_shard:
            raise ArgumentError(f"epoch: the dataset's {dataset.ndata} points must be a multiple of the batch "
                                f"({batch}), and the batch of ndata_shard ({dataset.ndata_shard})")
        if idata_split == -1:
            idata_split = dataset.ndata
        if type(idata_split) is not int or not 0 <= idata_split <= dataset.ndata or idata_split % batch:
            raise ArgumentError(f"epoch: idata_split must be -1 or a multiple of the batch ({batch}) in "
                                f"[0, {dataset.ndata}], got {idata_split!r}")
        if callback is not None and not callable(callback):
            raise ArgumentError("epoch: callback must be callable")
        if _callback_thread == threading.get_ident():
            raise InUseError("epoch: called from the callback of a running epoch (ggml-opt runs one epoch at a "
                             "time): call it after that epoch returns")
        self._set_params(dict(params or {}))
        return self._run_epoch(dataset, idata_split, callback)

    cdef tuple _run_epoch(self, Dataset dataset, int64_t split, object callback):
        """ggml_opt_epoch on a worker thread, holding the epoch lock and the scheduler's
        backends (their computes wait; their close() raises InUseError), the CPU backends'
        threads set as their computes would; Ctrl-C returns at once and stops ggml after
        the node it is in."""
        global _callback, _callback_error, _epoch_backends, _epoch_cancelled
        cdef tuple backends = self.scheduler.backends
        cdef Backend b
        cdef int n, n_cpu = 0
        cdef ggml_backend_t cpu[16]
        cdef pyggml_status failed
        _epoch_lock.acquire()
        try:
            lock_backends(backends, "epoch")
        except BaseException:
            _epoch_lock.release()
            raise
        cdef _EpochState state = _EpochState.__new__(_EpochState)
        cdef pyggml_async spec
        try:
            self._check()                    # a context or backend closed while this waited
            for b in backends:
                n = _need_threads(b._n_threads)
                b._set_threads(n)
                if b.is_cpu:
                    note_threads(n)
                    if n_cpu < 16:
                        cpu[n_cpu] = b.ptr
                        n_cpu += 1
            state.e.opt = self.ptr
            state.e.dataset = dataset.ptr
            state.e.result_train = ggml_opt_result_init()
            state.e.result_eval = ggml_opt_result_init()
            state.e.idata_split = split
            state.e.callback = NULL
            if callback is not None:
                state.e.callback = _on_batch
            memset(&spec, 0, sizeof(spec))
            spec.task = pyggml_opt_epoch_nothrow
            spec.task_arg = &state.e
            _callback, _callback_error, _epoch_backends, _epoch_cancelled = callback, None, backends, False
        except BaseException:
            _end_epoch(backends)
            raise
        if self._remote is not None:
            return _remote_epoch(self, dataset, state, backends)
        try:
            run_interruptibly(&spec, NULL, NULL, cpu, n_cpu, None, (self, dataset, state),
                              lambda: _end_epoch(backends), NULL)
        except BaseException:
            _epoch_cancelled = True          # the batches left run aborted, without callbacks
            raise
        err, _callback_error = _callback_error, None
        return _epoch_outcome(state, backends, err)


cdef tuple _epoch_outcome(_EpochState state, tuple backends, object err):
    """An epoch that returned (either route): ggml-opt's C++ exception (the backends are
    then unusable), else the callback's error, else the two results."""
    cdef pyggml_status failed
    cdef Backend b
    if pyggml_status_from_cxx(&failed, state.e.exception) != PYGGML_OK:
        for b in backends:
            b._poisoned = True
        raise_status(&failed, "epoch", "; the scheduler's backends are not usable any more")
    if err is not None:
        raise err
    return _result(state.e.result_train), _result(state.e.result_eval)


cdef tuple _remote_epoch(Optimizer self, Dataset dataset, _EpochState state, tuple backends):
    """The epoch over an RPC server: through remote_call, under the abort guard; the
    epoch lock and the backends held until it returns or is given up. Given up (the time
    limit, Ctrl-C, the connection lost), the epoch may still run on the worker: the
    Optimizer and the scheduler's CPU backends are not used again, and its batches call
    nobody back (their tag is no longer the current one)."""
    global _current_tag, _last_tag, _callback_error, _epoch_cancelled
    cdef _RemoteOpt r
    cdef Backend b
    memset(&r, 0, sizeof(r))
    r.what = 1
    r.epoch = &state.e
    _last_tag += 1
    _current_tag = r.tag = _last_tag
    try:
        remote_call(self._remote, _remote_opt, &r, sizeof(r), NULL, (self, dataset, state), "epoch")
    except BaseException as e:
        _epoch_cancelled = True
        self._given_up = f"an epoch over {self._remote.endpoint} was given up ({type(e).__name__})"
        for b in backends:
            if b.remote is None:
                b._poisoned = True
                b._poison_note = "an epoch that used it was given up, and may still run on it"
        _end_remote_epoch(backends)
        raise
    _end_remote_epoch(backends)
    err, _callback_error = _callback_error, None
    if not r.rc:
        self._given_up = f"an epoch over {self._remote.endpoint} aborted"
        for b in backends:
            if b.remote is None:
                b._poisoned = True
                b._poison_note = "an epoch that used it aborted inside ggml"
        raise_remote_aborted(self._remote, &r.g, "epoch (ggml-opt)")
    return _epoch_outcome(state, backends, err)


cdef int _end_remote_epoch(tuple backends) except -1:
    global _current_tag
    _current_tag = 0
    _end_epoch(backends)
    return 0


cdef int _check_forward(Graph g) except -1:
    """What ggml-opt's backward pass needs of the forward graph, before any C runs."""
    cdef int i, j
    cdef ggml_tensor * p
    cdef ggml_tensor * s
    cdef int n_param = 0
    nodes = g.nodes
    for t in nodes:
        p = (<Tensor>t).ptr
        if p.flags & GGML_TENSOR_FLAG_LOSS:
            raise ArgumentError("Optimizer: the forward graph has a loss already: ggml-opt adds its own")
        if pyggml_index_tensor(p) != NULL:
            raise ArgumentError(f"Optimizer: node {t.name!r} ({t.op}) reads positions from tensor values, which "
                                f"pyggml cannot check inside ggml-opt's compute")
        for j in range(-1, GGML_MAX_SRC):
            s = p if j == -1 else p.src[j]
            if s == NULL:
                continue
            if s.flags & GGML_TENSOR_FLAG_PARAM:
                n_param += 1
            if s.op == GGML_OP_NONE and s.view_src == NULL and s.data == NULL and ggml_nelements(s) != 0:
                raise ArgumentError(f"Optimizer: tensor {s.name.decode(errors='replace')!r} has no data: allocate "
                                    f"the inputs and parameters (e.g. Backend.alloc_ctx_tensors)")
    if n_param == 0:
        raise ArgumentError("Optimizer: no parameter in the forward graph; mark the weights with pyggml.set_param")
    cdef pyggml_status st
    pyggml_check_backward(g.ptr, &st)
    return raise_status(&st, "Optimizer")
