"""ggml's backends from Python (pyggml._backend): the device registry, the CPU backend,
tensors in backend buffers, and graphs computed by ggml_backend_graph_compute."""

import gc
import weakref

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.errors import ArgumentError, ContextClosedError, GGMLTypeError, UpstreamDefect


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_the_registry_lists_the_cpu_device():
    devs = pyggml.backends()
    cpu = [d for d in devs if d["type"] == "cpu"]
    assert cpu and cpu[0]["name"] == "CPU" and cpu[0]["description"]
    assert all(d["memory_total"] >= d["memory_free"] >= 0 for d in devs)


def test_backend_arguments_are_checked():
    with pytest.raises(ArgumentError, match="no device named 'nonesuch'.*devices: (.*, )?CPU"):
        pyggml.Backend("nonesuch")
    with pytest.raises(ArgumentError, match="name must be a str"):
        pyggml.Backend(3)
    with pytest.raises(ArgumentError, match="n_threads"):
        pyggml.Backend("CPU", n_threads=0)
    b = pyggml.Backend("cpu", n_threads=2)
    assert b.name == "CPU" and b.n_threads == 2 and "CPU" in repr(b)
    b.close()
    b.close()
    with pytest.raises(ArgumentError, match="closed"):
        b.graph_compute(pyggml.Graph(pyggml.Context(1 << 20)))


def _no_alloc_add(ctx):
    a = ctx.new_tensor(Type.F32, (5, 3))
    b = ctx.new_tensor(Type.F32, (5, 3))
    return a, b, pyggml.mul(ctx, pyggml.add(ctx, a, b), a)


def test_tensors_in_a_backend_buffer_compute_as_in_a_pool():
    x, y = f32(3, 5), f32(3, 5, seed=1)
    with pyggml.Backend("CPU", n_threads=2) as be, pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a, b, r = _no_alloc_add(ctx)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        with pytest.raises(ArgumentError, match="without data"):
            be.graph_compute(g)                 # nothing allocated yet
        buf = be.alloc_ctx_tensors(ctx)
        assert buf.host and buf.size >= 3 * 15 * 4 and "backend buffer" in repr(buf)
        assert be.alloc_ctx_tensors(ctx) is None       # everything has memory now
        a.set(x)
        b.numpy()[...] = y                      # a host buffer: numpy() is a zero-copy view
        assert b.numpy().ctypes.data == b.data_ptr
        be.graph_compute(g)
        got = r.get()
    with pyggml.Context(1 << 20) as pool:
        ta, tb = pool.from_numpy(x), pool.from_numpy(y)
        want = pyggml.mul(pool, pyggml.add(pool, ta, tb), ta)
        g2 = pyggml.Graph(pool)
        g2.build_forward_expand(want)
        g2.compute(2)
        assert np.array_equal(got, want.numpy())        # the same kernels: the same bits


def test_a_view_keeps_the_buffer_and_the_buffer_is_freed_after():
    be = pyggml.Backend()
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    t = ctx.new_tensor(Type.F32, (8,))
    buf = be.alloc_ctx_tensors(ctx)
    view = t.numpy()
    view[:] = 7
    gone = weakref.ref(buf)
    del buf
    ctx.close()
    be.close()                                   # the buffer does not need its backend
    gc.collect()
    assert gone() is not None and view.sum() == 56          # alive through the view
    with pytest.raises(ContextClosedError):
        t.get()
    del view
    gc.collect()
    assert gone() is None


def test_alloc_ctx_tensors_refuses_what_ggml_would_abort_on():
    be = pyggml.Backend()
    with pyggml.Context(1 << 20) as pool:
        with pytest.raises(ArgumentError, match="no_alloc context"):
            be.alloc_ctx_tensors(pool)
        a = pool.from_numpy(f32(4, 4))
        na = pyggml.Context(1 << 20, no_alloc=True)
        pyggml.transpose(na, a)                  # a view of a pool's tensor: ggml asserts
        with pytest.raises(ArgumentError, match="is a view of .* no backend buffer"):
            be.alloc_ctx_tensors(na)
        na.close()
        with pytest.raises(ContextClosedError):
            be.alloc_ctx_tensors(na)
        # views of tensors of another no_alloc context, allocated first: fine
        src = pyggml.Context(1 << 20, no_alloc=True)
        s = src.new_tensor(Type.F32, (4, 4))
        be.alloc_ctx_tensors(src)
        s.set(f32(4, 4))
        na2 = pyggml.Context(1 << 20, no_alloc=True)
        v = pyggml.transpose(na2, s)
        be.alloc_ctx_tensors(na2)
        assert np.array_equal(v.numpy(), s.numpy().T)


def test_get_and_set_check_what_they_copy():
    with pyggml.Context(1 << 20) as ctx:
        t = ctx.from_numpy(f32(2, 3))
        with pytest.raises(GGMLTypeError, match="dtype float64"):
            t.set(np.zeros((2, 3)))
        with pytest.raises(ArgumentError, match=r"shape \(3, 2\)"):
            t.set(np.zeros((3, 2), np.float32))
        with pytest.raises(GGMLTypeError, match="numpy.ndarray"):
            t.set([[1, 2, 3], [4, 5, 6]])
        with pytest.raises(ArgumentError, match="contiguous"):
            pyggml.transpose(ctx, t).get()
        t.set(np.arange(6, dtype=np.float32).reshape(2, 3))
        assert np.array_equal(t.get(), np.arange(6).reshape(2, 3)) and t.get().ctypes.data != t.data_ptr
        q = ctx.from_numpy(pyggml.quantize(Type.Q8_0, f32(2, 64)), type=Type.Q8_0)
        assert np.array_equal(q.get(), q.blocks())
    with pyggml.Context(1 << 20, no_alloc=True) as na:
        with pytest.raises(ArgumentError, match="no data"):
            na.new_tensor(Type.F32, (3,)).get()


def test_indices_are_checked_before_the_backend_runs():
    with pyggml.Context(1 << 20) as ctx:
        rows = ctx.from_numpy(f32(4, 3))
        idx = ctx.from_numpy(np.array([0, 9], np.int32))
        r = pyggml.get_rows(ctx, rows, idx)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        with pytest.raises(ArgumentError, match="9"):
            pyggml.Backend().graph_compute(g)
        idx.numpy()[1] = 3
        pyggml.Backend().graph_compute(g)
        assert np.array_equal(r.numpy(), rows.numpy()[[0, 3]])


def test_the_cpu_backend_is_refused_a_flash_attn_back_its_plan_under_sizes():
    with pyggml.Context(1 << 20) as ctx:
        q, k, v, d = (ctx.from_numpy(np.ones((1, 1, 1, 1), np.float32)) for _ in range(4))
        r = pyggml.flash_attn_back(ctx, q, k, v, d, False)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        shortfall = pyggml._cpu.fab_work_bytes(1, 1, 4) - g._plan_work_size(4)
        if shortfall <= 0:
            pytest.skip("this ggml plans enough work memory for tiny heads")
        with pytest.raises(UpstreamDefect, match="FLASH_ATTN_BACK") as e:
            pyggml.Backend("CPU", n_threads=4).graph_compute(g)
        assert e.value.defect == "fab-work-size"
        pyggml.Backend("CPU", n_threads=1).graph_compute(g)      # one thread: the plan is enough


def test_use_ref_and_supports_op():
    be = pyggml.Backend()
    with pyggml.Context(1 << 20) as ctx:
        r = pyggml.add(ctx, ctx.from_numpy(f32(3)), ctx.from_numpy(f32(3)))
        assert be.supports_op(r)
    if pyggml.build_info()["features"]["use_ref"]:
        be.set_use_ref(True)
        be.set_use_ref(False)
    else:
        with pytest.raises(pyggml.GGMLVersionError):
            be.set_use_ref(True)


def test_the_cpu_backend_path_agrees_bit_for_bit_with_graph_compute():
    from pyggml import parity
    rows = parity.check(["mul_mat", "soft_max_ext", "conv_2d", "get_rows", "rope_ext"], quick=True,
                        paths=["ggml", "cpu-backend", "reference"])
    pair = [r for r in rows if (r.a, r.b) == ("ggml", "cpu-backend")]
    assert len(pair) > 10
    assert all(r.verdict in ("ok", "refused") for r in pair)
    assert all(r.nmse == 0.0 and r.tol == 0.0 for r in pair if r.verdict == "ok")


def _mlp(ctx, w, x):
    h = pyggml.relu(ctx, pyggml.mul_mat(ctx, w, x))
    for _ in range(4):
        h = pyggml.relu(ctx, pyggml.mul_mat(ctx, w, h))     # a chain: intermediates can share memory
    return h


def test_the_graph_allocator_places_a_graph_and_reuses_memory():
    wv, xv = f32(16, 16) / 4, f32(2, 16, seed=1)
    be = pyggml.Backend()
    weights = pyggml.Context(1 << 20, no_alloc=True)
    w = weights.new_tensor(Type.F32, (16, 16))
    be.alloc_ctx_tensors(weights)
    w.set(wv)
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    x = ctx.new_tensor(Type.F32, (16, 2))
    pyggml.set_input(x)
    y = _mlp(ctx, w, x)
    g = pyggml.Graph(ctx)
    g.build_forward_expand(y)
    galloc = pyggml.GraphAllocator(be)
    nbytes = galloc.alloc_graph(g)
    assert 0 < nbytes < 11 * 2 * 16 * 4          # less than every node its own memory
    x.set(xv)
    be.graph_compute(g)
    got = y.get()
    out = y.numpy()                              # a view of the allocation
    with pyggml.Context(1 << 20) as pool:
        want = _mlp(pool, pool.from_numpy(wv), pool.from_numpy(xv))
        g2 = pyggml.Graph(pool)
        g2.build_forward_expand(want)
        g2.compute(1)
        assert np.array_equal(got, want.numpy())
    # a second allocation by the same allocator releases the first but for the tensors
    # the new graph uses (w here, which alloc_ctx_tensors placed anyway): the old graph's
    # tensors lose their data, its computes are refused, the view taken before keeps
    # what it shows
    ctx2 = pyggml.Context(1 << 20, no_alloc=True)
    z = pyggml.sum(ctx2, pyggml.mul_mat(ctx2, w, w))
    g3 = pyggml.Graph(ctx2)
    g3.build_forward_expand(z)
    galloc.alloc_graph(g3)
    be.graph_compute(g3)
    assert np.isclose(z.get()[0], (wv @ wv.T).sum(), rtol=1e-4)
    assert x.data_ptr == 0 and y.data_ptr == 0 and w.data_ptr != 0
    with pytest.raises(ArgumentError, match="without data"):
        be.graph_compute(g)
    with pytest.raises(ArgumentError, match="without data"):
        g.compute(1)
    with pytest.raises(ArgumentError, match="has no data.*allocate it again"):
        y.get()
    assert np.array_equal(out, got)
    galloc.alloc_graph(g)                        # allocated again: computes again
    x.set(xv)
    be.graph_compute(g)
    assert np.array_equal(y.get(), got)


def test_the_graph_allocator_checks_its_arguments():
    with pytest.raises(TypeError):
        pyggml.GraphAllocator(None)
    be = pyggml.Backend()
    galloc = pyggml.GraphAllocator(be)
    be.close()
    with pytest.raises(ArgumentError, match="closed"):
        galloc.alloc_graph(pyggml.Graph(pyggml.Context(1 << 20)))


# --- ggml's log: captured in guarded calls, stderr elsewhere -----------------------------

@pytest.mark.parametrize("kind", ["allocator", "scheduler"])
def test_an_allocation_that_fails_says_what_ggml_logged(kind, capfd):
    """ggml says why an allocation failed only in its log (then returns false): pyggml
    captures the log of every guarded call, and the error carries those lines instead of
    them going to stderr apart from it."""
    from pyggml.errors import ContextFullError, GGMLAbort
    from sources import built_from_the_pin
    # ggml 0.20.2's scheduler dereferences the buffer it failed to allocate (SIGSEGV, caught
    # by the guard: GGMLAbort), which the pinned release does not: the log is in either error
    raised = ContextFullError if kind == "allocator" or built_from_the_pin() else (ContextFullError, GGMLAbort)
    cpu = pyggml.Backend("CPU")          # closed by the collector, after the scheduler that uses it
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        t = ctx.new_tensor(Type.F32, (1 << 20, 1 << 19))          # 2 TiB
        g = pyggml.Graph(ctx)
        g.build_forward_expand(pyggml.scale(ctx, t, 2.0))
        alloc = pyggml.GraphAllocator(cpu) if kind == "allocator" else pyggml.Scheduler([cpu])
        with pytest.raises(raised, match=r"\(ggml logged: .*failed to allocate buffer of size 2199023255552"):
            alloc.alloc_graph(g)
    # ggml's lines went into the error, not to stderr (an ASan build's allocator warns there itself)
    assert "ggml_gallocr_reserve_n" not in capfd.readouterr().err


def test_what_ggml_logs_outside_a_guarded_call_goes_to_stderr():
    """pyggml's log callback (installed with the abort guard) keeps ggml's default behaviour
    for a line logged outside a guarded call: stderr."""
    import subprocess
    import sys
    # the libggml-base this process loaded (pyggml's own, or a system ggml's)
    code = ("import ctypes, os, pyggml; "
            "path = next(ln.split()[-1] for ln in open('/proc/self/maps') "
            "if os.path.basename(ln.split()[-1]).startswith('libggml-base')); "
            "lib = ctypes.CDLL(path); "
            "lib.ggml_log_internal(4, b'%s\\n', b'a line ggml logged')")    # GGML_LOG_LEVEL_ERROR
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0 and proc.stderr == "a line ggml logged\n", proc.stderr
