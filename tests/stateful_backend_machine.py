"""A hypothesis state machine over pyggml's backend layer, for tests/test_stateful.py.

Rules start and close Backends, make no_alloc contexts, tensors, ops and graphs, allocate
them (``alloc_ctx_tensors``, GraphAllocators and Schedulers, again and again), compute
them on every executor (also on a second thread racing a close, a re-allocation or a
compute on the same backend), read and write tensors, take numpy views, build Datasets
and train Optimizers whose callbacks close contexts, compute or re-enter, and collect
garbage, in orderings no test lists.

Invariants: every call returns or raises a pyggml exception (never a crash: the test
runs this in a fresh interpreter, and under ASan in the sanitizer stage); numpy views
keep their memory; a graph computed in fresh memory (``checked``) gives the right answer
whatever else exists, was released or closed. Run as
``python stateful_backend_machine.py EXAMPLES STEPS``: prints the steps and calls.
"""

import gc
import os
import sys
import threading

import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import pyggml as g
from pyggml import opt

EXPECTED = (g.GGMLError, ValueError, TypeError, MemoryError)
SANITIZED = os.environ.get("PYGGML_SANITIZED") == "1"
OPS = ["add", "mul", "sub", "scale", "relu", "mul_mat", "sum", "cont", "transpose"]
COUNT = {"steps": 0, "calls": 0, "checked": 0}


class BackendMachine(RuleBasedStateMachine):
    backends = Bundle("backends")
    contexts = Bundle("contexts")
    tensors = Bundle("tensors")
    graphs = Bundle("graphs")
    allocators = Bundle("allocators")

    def __init__(self):
        super().__init__()
        self.views = []

    def call(self, fn, *args, **kw):
        COUNT["calls"] += 1
        try:
            return fn(*args, **kw)
        except EXPECTED:
            return None

    def race(self, first, second):
        """``first`` on another thread while this one runs ``second``."""
        t = threading.Thread(target=self.call, args=(first,))
        t.start()
        self.call(second)
        t.join()

    @initialize(target=backends)
    def first_backend(self):
        return g.Backend("CPU", n_threads=1)

    @rule(target=backends, n=st.sampled_from([None, 1, 2]))
    def new_backend(self, n):
        return self.call(g.Backend, "CPU", n_threads=n)

    @rule(be=backends)
    def close_backend(self, be):
        if be is not None:
            self.call(be.close)

    @rule(target=contexts, no_alloc=st.booleans())
    def new_context(self, no_alloc):
        return g.Context(1 << 20, no_alloc=no_alloc)

    @rule(ctx=contexts)
    def close_context(self, ctx):
        self.call(ctx.close)

    @rule(target=tensors, ctx=contexts, shape=st.sampled_from([(4,), (4, 3), (3, 4), (4, 4), (8, 2), (0,)]),
          input_=st.booleans())
    def new_tensor(self, ctx, shape, input_):
        t = self.call(ctx.new_tensor, g.Type.F32, shape)
        if t is not None and input_:
            self.call(g.set_input, t)
        return t

    @rule(target=tensors, ctx=contexts, name=st.sampled_from(OPS), a=tensors, b=tensors)
    def op(self, ctx, name, a, b):
        if a is None or b is None:
            return None
        if name == "scale":
            return self.call(g.scale, ctx, a, 0.5)
        if name in ("relu", "sum", "cont", "transpose"):
            return self.call(getattr(g, name), ctx, a)
        return self.call(getattr(g, name), ctx, a, b)

    @rule(target=tensors, ctx=contexts, a=tensors, ne0=st.integers(0, 4), offset=st.sampled_from([0, 4, 3]))
    def view(self, ctx, a, ne0, offset):
        return None if a is None else self.call(g.view_1d, ctx, a, ne0, offset)

    @rule(target=graphs, ctx=contexts)
    def graph(self, ctx):
        return self.call(g.Graph, ctx, 64)

    @rule(graph=graphs, t=tensors)
    def expand(self, graph, t):
        if graph is not None and t is not None:
            self.call(graph.build_forward_expand, t)

    # --- memory ----------------------------------------------------------------------------

    @rule(be=backends, ctx=contexts)
    def alloc_ctx_tensors(self, be, ctx):
        if be is not None:
            self.call(be.alloc_ctx_tensors, ctx)

    @rule(target=allocators, be=backends, sched=st.booleans())
    def new_allocator(self, be, sched):
        if be is None:
            return None
        return self.call(g.Scheduler, [be]) if sched else self.call(g.GraphAllocator, be)

    @rule(al=allocators, graph=graphs)
    def alloc_graph(self, al, graph):
        if al is not None and graph is not None:
            self.call(al.alloc_graph, graph)

    @rule(al=allocators, t=tensors)
    def backend_of(self, al, t):
        if isinstance(al, g.Scheduler) and t is not None:
            self.call(al.backend_of, t)

    @rule(t=tensors, fill=st.floats(-2, 2))
    def set_get(self, t, fill):
        if t is None:
            return
        shape = self.call(lambda: t.shape)
        if shape is not None:
            self.call(t.set, np.full(shape, fill, np.float32))
        self.call(t.get)

    @rule(t=tensors)
    def take_view(self, t):
        a = None if t is None else self.call(t.numpy)
        if a is not None and a.size:            # an empty tensor's is a fresh empty array
            self.views.append(a)

    # --- computing -------------------------------------------------------------------------

    @rule(graph=graphs, be=backends, al=allocators, how=st.sampled_from(["graph", "backend", "scheduler"]))
    def compute(self, graph, be, al, how):
        if graph is None:
            return
        if how == "graph":
            self.call(graph.compute, 1)
        elif how == "backend" and be is not None:
            self.call(be.graph_compute, graph)
        elif how == "scheduler" and isinstance(al, g.Scheduler):
            self.call(al.graph_compute, graph)

    @rule(graph=graphs, be=backends, ctx=contexts, al=allocators,
          other=st.sampled_from(["close_context", "close_backend", "realloc", "compute"]))
    def compute_racing(self, graph, be, ctx, al, other):
        if graph is None or be is None:
            return
        second = {"close_context": ctx.close, "close_backend": be.close,
                  "realloc": (lambda: al.alloc_graph(graph)) if al is not None else (lambda: None),
                  "compute": lambda: be.graph_compute(graph)}[other]
        self.race(lambda: be.graph_compute(graph), second)

    @rule(be=backends, graph=graphs, other=backends)
    def compare(self, be, graph, other):
        if be is not None and other is not None and graph is not None:
            self.call(g.compare_graph_backend, graph, be, other)

    @rule(be=backends, sched=st.booleans(), scale=st.sampled_from([0.5, 2.0, -1.0]))
    def checked(self, be, sched, scale):
        """A graph in fresh memory computes right whatever else was released or closed."""
        if be is None:
            return
        ctx = g.Context(1 << 20, no_alloc=True)
        a = ctx.new_tensor(g.Type.F32, (6, 2))
        b = ctx.new_tensor(g.Type.F32, (6, 2))
        g.set_input(a)
        g.set_input(b)
        y = g.add(ctx, g.scale(ctx, a, scale), b)
        gr = g.Graph(ctx)
        gr.build_forward_expand(y)
        x = np.arange(12, dtype=np.float32).reshape(2, 6)
        COUNT["calls"] += 1
        try:
            al = g.Scheduler([be]) if sched else g.GraphAllocator(be)
            al.alloc_graph(gr)
            a.set(x)
            b.set(x + 1)
            (al.graph_compute if sched else be.graph_compute)(gr)
        except EXPECTED:
            return                      # a closed backend, a busy one, ...
        np.testing.assert_array_equal(y.get(), scale * x + x + 1)
        np.testing.assert_array_equal(a.get(), x)            # an input is never overwritten
        COUNT["checked"] += 1

    # --- training --------------------------------------------------------------------------

    @rule(n=st.sampled_from([1, 4, 2 ** 34, 0]), ne=st.sampled_from([1, 3]))
    def dataset(self, n, ne):
        if n == 2 ** 34 and SANITIZED:
            return          # ASan's operator new aborts where glibc's throws std::bad_alloc
        self.call(opt.Dataset, n, ne, 2)

    @rule(be=backends, ctx=contexts, graph=graphs,
          action=st.sampled_from(["none", "close_compute", "close_other", "compute", "epoch", "close_backend"]))
    def train(self, be, ctx, graph, action):
        if be is None:
            return
        sched = self.call(opt.Scheduler, [be])
        if sched is None:
            return
        weights = g.Context(1 << 20, no_alloc=True)
        w = weights.new_tensor(g.Type.F32, (3, 2))
        x = weights.new_tensor(g.Type.F32, (3, 4))
        g.set_param(w)
        if self.call(be.alloc_ctx_tensors, weights) is None:
            return
        w.set(np.full((2, 3), 0.1, np.float32))
        compute = g.Context(4 << 20, no_alloc=True)
        logits = g.mul_mat(compute, w, x)
        trainer = self.call(opt.Optimizer, sched, compute, x, logits)
        if trainer is None:
            return
        data = opt.Dataset(8, 3, 2)
        data.data[...] = 1.0
        data.labels[...] = np.eye(2, dtype=np.float32)[np.arange(8) % 2]

        def cb(train, ibatch, imax, result):
            if action == "close_compute":
                compute.close()
            elif action == "close_other":
                self.call(ctx.close)
            elif action == "compute" and graph is not None:
                self.call(be.graph_compute, graph)
            elif action == "epoch":
                self.call(trainer.epoch, data)
            elif action == "close_backend":
                self.call(be.close)
            gc.collect()
        self.call(trainer.epoch, data, callback=cb)
        self.call(trainer.epoch, data)

    @rule()
    def collect(self):
        gc.collect()

    @invariant()
    def views_keep_their_memory(self):
        COUNT["steps"] += 1
        for a in self.views[-20:]:
            base = a
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            assert type(base) is g.Storage and base.size > 0
            a.sum()

    def teardown(self):
        self.views.clear()


def main(examples, steps):
    run_state_machine_as_test(BackendMachine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    print(f"steps {COUNT['steps']} calls {COUNT['calls']} checked {COUNT['checked']}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
