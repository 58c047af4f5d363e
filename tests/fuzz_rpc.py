"""Random use of an RPC backend with a fault at a random moment, for tests/test_backend_rpc.py.

Run as ``python fuzz_rpc.py SEED``: starts a server (pyggml.rpc.RPCServer), then 60 random
steps (allocations in the server's memory, get/set, computes through the graph allocator and
the scheduler over [RPC, CPU], compare_graph_backend, frees, new Backends, close), and at a
random step one fault: the server killed or stopped (SIGSTOP), at once or from a timer
thread in the middle of a step, or Ctrl-C. Every outcome must be a value, a pyggml
exception or KeyboardInterrupt, and the process must exit 0, promptly: a ggml abort, a
crash or a hang is a failure. Prints the seed, the fault and the exceptions seen.
"""

import gc
import os
import random
import signal
import sys
import threading
import time

import numpy as np

import pyggml
from pyggml import Type
from pyggml.errors import GGMLError

LIMIT_S = 2.0          # the Backends' time limit: a stopped server costs this much per call


def main(seed: int) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)   # a parent that ignores SIGINT passes that on
    rng = random.Random(seed)
    server = pyggml.rpc.RPCServer()
    state = {"be": pyggml.Backend("RPC", endpoint=server.endpoint, timeout=LIMIT_S)}
    cpu = pyggml.Backend("CPU")
    objs: list = []
    fault_at = rng.randrange(2, 25)
    fault = rng.choice(["kill", "stop", "sigint", "kill_timer", "stop_timer"])

    def alloc():
        ctx = pyggml.Context(1 << 20, no_alloc=True)
        n = rng.choice([4, 64, 512])
        a, b = ctx.new_tensor(Type.F32, (n, n)), ctx.new_tensor(Type.F32, (n, 3))
        state["be"].alloc_ctx_tensors(ctx, weights=rng.random() < 0.5)
        a.set(np.full((n, n), 1.0 / n, np.float32))
        b.set(np.ones((3, n), np.float32))
        objs.append((ctx, a, b))

    def get():
        if objs:
            _, a, b = rng.choice(objs)
            a.get()
            b.get()

    def compute():
        if not objs:
            return
        _, a, b = rng.choice(objs)
        ctx = pyggml.Context(1 << 20, no_alloc=True)
        x = b
        for _ in range(rng.randrange(1, 30)):
            x = pyggml.mul_mat(ctx, a, x)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(x)
        if rng.random() < 0.5:
            pyggml.GraphAllocator(state["be"]).alloc_graph(g)
            state["be"].graph_compute(g)
        else:
            sched = pyggml.Scheduler([state["be"], cpu])
            sched.alloc_graph(g)
            sched.graph_compute(g)
        np.testing.assert_allclose(x.get(), 1.0, rtol=1e-4)      # each product keeps the ones
        objs.append((ctx, a, b))

    def compare():
        ctx = pyggml.Context(1 << 20, no_alloc=True)
        a = ctx.new_tensor(Type.F32, (16, 8))
        y = pyggml.relu(ctx, pyggml.mul_mat(ctx, a, a))
        g = pyggml.Graph(ctx)
        g.build_forward_expand(y)
        cpu.alloc_ctx_tensors(ctx)
        a.set(np.ones((8, 16), np.float32))
        pyggml.compare_graph_backend(g, cpu, state["be"])

    def free():
        if objs:
            objs.pop(rng.randrange(len(objs)))
            gc.collect()

    def backend():
        state["be"] = pyggml.Backend("RPC", endpoint=server.endpoint, timeout=LIMIT_S)

    def close():
        try:
            state["be"].close()
        except pyggml.InUseError:
            pass

    def do_fault():
        if fault.startswith("kill"):
            server.kill()
        elif fault.startswith("stop"):
            os.kill(server.pid, signal.SIGSTOP)
        else:
            os.kill(os.getpid(), signal.SIGINT)

    steps = [alloc, alloc, get, compute, compute, compute, compare, free, backend] * 4 + [close]
    seen: dict[str, int] = {}

    def note(name: str) -> None:
        seen[name] = seen.get(name, 0) + 1

    # the one SIGINT may land anywhere, the handler of another exception included: the
    # outer handler takes what lands outside the inner one
    for i in range(60):
        try:
            if i == fault_at:
                if fault.endswith("_timer") or fault == "sigint":
                    t = threading.Timer(rng.random() * 0.3, do_fault)
                    t.daemon = True
                    t.start()
                else:
                    do_fault()
            step = rng.choice(steps)
            try:
                step()
            except (GGMLError, KeyboardInterrupt) as e:
                note(type(e).__name__)
        except KeyboardInterrupt:
            note("KeyboardInterrupt")
    try:
        time.sleep(0.4)                 # a timer that has not fired yet fires here
    except KeyboardInterrupt:
        note("KeyboardInterrupt")
    if fault.startswith("stop"):
        os.kill(server.pid, signal.SIGCONT)
    server.kill()
    print(seed, fault, fault_at, seen, flush=True)


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]))
    except KeyboardInterrupt:
        # the Ctrl-C fault can land in this script's own bookkeeping, outside every handler
        # (seen: in the clean-up of an except clause): not pyggml's, and not a crash
        print(sys.argv[1], "interrupted between steps", flush=True)
