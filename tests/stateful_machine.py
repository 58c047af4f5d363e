"""A hypothesis state machine over pyggml's objects, for tests/test_stateful.py.

Rules create contexts, tensors (plain, from numpy, views), ops drawn from the op table,
graphs forward and backward, computes (also on a second thread, racing a close),
closes, garbage collection, gradients and numpy views, in any order hypothesis finds.
Invariants: every call returns or raises a pyggml exception; numpy views taken earlier
keep their memory whatever was closed or collected since. Run as
``python stateful_machine.py EXAMPLES STEPS``: prints the number of steps and calls.
"""

import gc
import sys
import threading

import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import pyggml as g
from pyggml import _optable

EXPECTED = (g.GGMLError, ValueError, TypeError, MemoryError)
SIMPLE = sorted(r["name"] for r in _optable.OPS if r["available"]
                and all(kind == "tensor" for _, _, kind in r["params"]) and 1 <= len(r["params"]) <= 2)
COUNT = {"steps": 0, "calls": 0}


class PyggmlMachine(RuleBasedStateMachine):
    contexts = Bundle("contexts")
    tensors = Bundle("tensors")
    graphs = Bundle("graphs")

    def __init__(self):
        super().__init__()
        self.views = []          # (array, a copy of its values then)

    def call(self, fn, *args):
        COUNT["calls"] += 1
        try:
            return fn(*args)
        except EXPECTED:
            return None

    @initialize(target=contexts)
    def first_context(self):
        return g.Context(1 << 20)

    @rule(target=contexts, size=st.sampled_from([1 << 10, 1 << 16, 1 << 20]), no_alloc=st.booleans())
    def new_context(self, size, no_alloc):
        return self.call(g.Context, size, no_alloc) or g.Context(1 << 16)

    @rule(target=tensors, ctx=contexts, shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
          typ=st.sampled_from([g.Type.F32, g.Type.F32, g.Type.F16, g.Type.I32]))
    def new_tensor(self, ctx, shape, typ):
        t = self.call(ctx.new_tensor, typ, shape)
        if t is not None and not ctx.no_alloc:
            a = self.call(t.numpy)
            if a is not None:
                a[...] = 1
        return t

    @rule(target=tensors, ctx=contexts, shape=st.lists(st.integers(1, 4), min_size=1, max_size=3))
    def from_numpy(self, ctx, shape):
        return self.call(ctx.from_numpy, np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))

    @rule(target=tensors, ctx=contexts, name=st.sampled_from(SIMPLE), a=tensors, b=tensors)
    def op(self, ctx, name, a, b):
        if a is None or b is None:
            return None
        n = len(next(r for r in _optable.OPS if r["name"] == name)["params"])
        return self.call(getattr(g, name), ctx, *([a, b][:n]))

    @rule(target=tensors, ctx=contexts, a=tensors, ne0=st.integers(0, 6), offset=st.sampled_from([0, 4, 8, 3]))
    def view(self, ctx, a, ne0, offset):
        if a is None:
            return None
        return self.call(g.view_1d, ctx, a, ne0, offset)

    @rule(target=graphs, ctx=contexts, grads=st.booleans(), size=st.sampled_from([2, 8, 64]))
    def graph(self, ctx, grads, size):
        return self.call(g.Graph, ctx, size, grads)

    @rule(graph=graphs, t=tensors)
    def expand(self, graph, t):
        if graph is not None and t is not None:
            self.call(graph.build_forward_expand, t)

    @rule(graph=graphs, ctx=contexts, t=tensors, p=tensors)
    def backward(self, graph, ctx, t, p):
        if graph is None or t is None or p is None:
            return
        self.call(g.set_param, p)
        loss = self.call(g.sum, ctx, t)
        if loss is not None:
            self.call(g.set_loss, loss)
            self.call(graph.build_forward_expand, loss)
            self.call(graph.build_backward_expand, ctx)

    @rule(graph=graphs, n=st.integers(1, 3))
    def compute(self, graph, n):
        if graph is not None:
            self.call(graph.compute, n)

    @rule(graph=graphs, ctx=contexts)
    def compute_while_closing(self, graph, ctx):
        if graph is None:
            return
        t = threading.Thread(target=self.call, args=(graph.compute, 2))
        t.start()
        self.call(ctx.close)
        t.join()

    @rule(ctx=contexts)
    def close(self, ctx):
        self.call(ctx.close)

    @rule()
    def collect(self):
        gc.collect()

    @rule(graph=graphs, t=tensors)
    def grad(self, graph, t):
        if graph is not None and t is not None:
            gt = self.call(graph.grad, t)
            if gt is not None:
                self.call(gt.numpy)

    @rule(t=tensors)
    def take_view(self, t):
        if t is None:
            return
        a = self.call(t.numpy)
        if a is not None:
            self.views.append((a, a.copy()))

    @invariant()
    def views_keep_their_memory(self):
        # a numpy view may see new values (a compute writes its tensor) but its memory is
        # always a live Storage it holds itself, whatever was closed or collected since
        COUNT["steps"] += 1
        for a, _ in self.views[-20:]:
            base = a
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            assert type(base) is g.Storage and base.size > 0
            a.sum()

    def teardown(self):
        self.views.clear()


def main(examples, steps):
    run_state_machine_as_test(PyggmlMachine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    print(f"steps {COUNT['steps']} calls {COUNT['calls']}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
