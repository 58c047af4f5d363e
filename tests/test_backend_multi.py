"""More than one backend: the BLAS backend (a build with PYGGML_BLAS=ON), the
scheduler's own graph API (ggml_backend_sched over several backends), and
ggml_backend_compare_graph_backend.

The BLAS tests skip in a build without BLAS, unless PYGGML_REQUIRE_BACKENDS names it
(the upstream matrix's BLAS spec sets it: there they must run)."""

import gc
import os

import numpy as np
import pytest

import pyggml
from pyggml import Type, reference
from pyggml.errors import ArgumentError, UnsupportedOpError

DEVICES = {d["name"] for d in pyggml.backends()}
REQUIRED = {n for n in os.environ.get("PYGGML_REQUIRE_BACKENDS", "").split(",") if n}


def test_the_backends_this_build_must_have_are_there():
    assert REQUIRED <= DEVICES, f"PYGGML_REQUIRE_BACKENDS={sorted(REQUIRED)}, this build has {sorted(DEVICES)}"
    assert "CPU" in DEVICES


needs_blas = pytest.mark.skipif("BLAS" not in DEVICES, reason="a build without PYGGML_BLAS=ON")


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _mm_graph(ctx, K=64, M=48, N=40, then_add=True):
    """a (K x M) . b (K x N) -> (M x N) in ggml's order, plus an add the BLAS backend lacks."""
    a = ctx.new_tensor(Type.F32, (K, M))
    b = ctx.new_tensor(Type.F32, (K, N))
    mm = pyggml.mul_mat(ctx, a, b)
    out = pyggml.add(ctx, mm, mm) if then_add else mm
    g = pyggml.Graph(ctx)
    g.build_forward_expand(out)
    return a, b, mm, out, g


@needs_blas
def test_blas_computes_a_matrix_product_as_float64_does():
    x, y = f32(48, 64), f32(40, 64, seed=1)
    with pyggml.Backend("BLAS") as blas, pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a, b, mm, _, g = _mm_graph(ctx, then_add=False)
        assert blas.supports_op(mm)
        blas.alloc_ctx_tensors(ctx)
        a.set(x)
        b.set(y)
        blas.graph_compute(g)
        got = mm.numpy()
    want = y.astype(np.float64) @ x.astype(np.float64).T          # ggml's mul_mat: b a^T
    assert got.shape == want.shape
    assert reference.nmse(got, want) < 1e-10


@needs_blas
def test_blas_refuses_a_node_it_cannot_compute_before_ggml_aborts():
    with pyggml.Backend("BLAS") as blas, pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a, b, mm, out, g = _mm_graph(ctx)
        assert not blas.supports_op(out)
        blas.alloc_ctx_tensors(ctx)
        a.set(f32(48, 64))
        b.set(f32(40, 64))
        with pytest.raises(UnsupportedOpError, match=r"BLAS cannot compute node 1 \(ADD") as e:
            blas.graph_compute(g)
        assert e.value.op == "ADD" and e.value.backend == "BLAS"
        small = pyggml.mul_mat(ctx, ctx.new_tensor(Type.F32, (8, 4)), ctx.new_tensor(Type.F32, (8, 4)))
        assert not blas.supports_op(small)     # ggml-blas leaves products under 32 to the CPU


def _openblas():
    """The OpenBLAS ggml-blas loaded (ctypes, the same instance), or None."""
    import ctypes
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libopenblas" in line}
    return ctypes.CDLL(sorted(paths)[0]) if paths else None


@needs_blas
def test_the_blas_backend_computes_on_the_threads_it_is_given():
    # ggml-blas sets its BLAS library's threads before every product, to 4 unless told
    # (GGML_DEFAULT_N_THREADS: twice this machine's cores on 2): pyggml tells it the
    # backend's n_threads, in a compute on the backend and in a scheduler's
    lib = _openblas()
    if lib is None:
        pytest.skip("the BLAS backend's library is not OpenBLAS")
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a, b, mm, out, g = _mm_graph(ctx, then_add=False)
        blas = pyggml.Backend("BLAS", n_threads=1)
        blas.alloc_ctx_tensors(ctx)
        a.set(f32(48, 64))
        b.set(f32(40, 64))
        for n in (1, 2, 1):
            blas.n_threads = n
            blas.graph_compute(g)
            assert lib.openblas_get_num_threads() == n
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    a, b, mm, out, g = _mm_graph(ctx)
    sched = pyggml.Scheduler([pyggml.Backend("BLAS", n_threads=2), pyggml.Backend("CPU", n_threads=1)])
    sched.alloc_graph(g)
    a.set(f32(48, 64))
    b.set(f32(40, 64))
    sched.graph_compute(g)
    assert lib.openblas_get_num_threads() == 2
    sched.graph_compute(g, n_threads=1)             # a compute's own count, for every backend
    assert lib.openblas_get_num_threads() == 1


@pytest.mark.parametrize("with_blas", [False, pytest.param(True, marks=needs_blas)])
def test_the_scheduler_splits_allocates_and_computes_a_graph(with_blas):
    x, y = f32(48, 64), f32(40, 64, seed=1)
    cpu = pyggml.Backend("CPU", n_threads=2)
    bs = [pyggml.Backend("BLAS"), cpu] if with_blas else [cpu]
    sched = pyggml.Scheduler(bs)
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    a, b, mm, out, g = _mm_graph(ctx)
    pyggml.set_input(a)
    pyggml.set_input(b)
    pyggml.set_output(out)
    assert sched.backend_of(mm) is None and sched.n_splits == 0
    assert sched.alloc_graph(g) >= 4 * (48 * 64 + 40 * 64 + 48 * 40)
    assert sched.backend_of(mm) is bs[0]
    assert sched.backend_of(out) is cpu
    assert sched.n_splits == (2 if with_blas else 1)
    a.set(x)
    b.set(y)
    sched.graph_compute(g)
    want = 2 * (y.astype(np.float64) @ x.astype(np.float64).T)
    assert reference.nmse(out.numpy(), want) < 1e-10
    view = out.numpy()
    first = view.copy()
    # a second computation of the same allocated graph, new inputs
    a.set(2 * x)
    sched.graph_compute(g)
    assert np.allclose(view, 2 * first, rtol=1e-5, atol=1e-4)
    # the view keeps the scheduler's buffers after everything else is gone
    del sched, g, out, mm, a, b, bs
    ctx.close()
    gc.collect()
    assert np.allclose(view, 2 * first, rtol=1e-5, atol=1e-4)


def test_a_graph_pointing_into_a_replaced_scheduler_allocation_is_refused():
    cpu = pyggml.Backend("CPU")
    sched = pyggml.Scheduler([cpu])
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    a, b, mm, out, g = _mm_graph(ctx, K=4, M=3, N=2)
    sched.alloc_graph(g)
    a2, b2 = ctx.new_tensor(Type.F32, (4, 3)), ctx.new_tensor(Type.F32, (4, 2))
    g2 = pyggml.Graph(ctx)
    g2.build_forward_expand(pyggml.mul_mat(ctx, a2, b2))
    sched.alloc_graph(g2)           # a new allocation: g's tensors point into the released one
    with pytest.raises(ArgumentError, match="replaced"):
        cpu.graph_compute(g)
    sched.graph_compute(g2)


def test_tensors_placed_by_an_earlier_allocation_keep_its_memory():
    cpu = pyggml.Backend("CPU")
    sched = pyggml.Scheduler([cpu])
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    a, b, mm, out, g = _mm_graph(ctx, K=4, M=3, N=2, then_add=False)
    sched.alloc_graph(g)
    x, y = f32(3, 4), f32(2, 4, seed=1)
    a.set(x)
    b.set(y)
    b2 = ctx.new_tensor(Type.F32, (4, 2))
    g2 = pyggml.Graph(ctx)
    mm2 = pyggml.mul_mat(ctx, a, b2)            # a stays where the first allocation put it
    g2.build_forward_expand(mm2)
    sched.alloc_graph(g2)
    b2.set(2 * y)
    gc.collect()
    sched.graph_compute(g2)
    assert np.allclose(mm2.numpy(), 2 * (y @ x.T), rtol=1e-5, atol=1e-5)
    # the first graph's other tensors (b, mm) were released by the second allocation
    with pytest.raises(ArgumentError, match="without data"):
        cpu.graph_compute(g)
    sched.alloc_graph(g)            # a again stays where it is, with its values
    assert np.array_equal(a.get(), x) and mm2.data_ptr == 0
    b.set(y)
    sched.graph_compute(g)
    assert np.allclose(mm.numpy(), y @ x.T, rtol=1e-5, atol=1e-5)


def test_the_scheduler_checks_its_arguments():
    cpu = pyggml.Backend("CPU")
    with pytest.raises(ArgumentError, match="non-empty"):
        pyggml.Scheduler([])
    sched = pyggml.Scheduler([cpu])
    with pytest.raises(TypeError):
        sched.alloc_graph(None)
    ctx = pyggml.Context(1 << 20, no_alloc=True)
    a, b, mm, out, g = _mm_graph(ctx, K=4, M=3, N=2)
    ctx.close()
    with pytest.raises(ArgumentError, match="closed"):
        sched.graph_compute(g)
    with pytest.raises(pyggml.InUseError, match="a Scheduler uses it"):
        cpu.close()


def test_compare_graph_backend_on_two_cpu_backends_agrees_bit_for_bit():
    x, y = f32(48, 64), f32(40, 64, seed=1)
    with pyggml.Backend("CPU") as one, pyggml.Backend("CPU") as two, \
            pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a, b, mm, out, g = _mm_graph(ctx)
        one.alloc_ctx_tensors(ctx)
        a.set(x)
        b.set(y)
        res = pyggml.compare_graph_backend(g, one, two, tolerance=0.0)
        assert [n["op"] for n in res["nodes"]] == ["MUL_MAT", "ADD"]
        assert all(n["compared"] and n["nmse"] == 0.0 and n["n"] == 48 * 40 for n in res["nodes"])
        assert res["first_diverging"] is None


@needs_blas
def test_compare_graph_backend_names_the_first_node_blas_computes_differently():
    x, y = f32(48, 64), f32(40, 64, seed=1)
    with pyggml.Backend("CPU") as cpu, pyggml.Backend("BLAS") as blas, \
            pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a, b, mm, _, g = _mm_graph(ctx, then_add=False)
        gs = pyggml.Graph(ctx)
        gs.build_forward_expand(pyggml.scale(ctx, mm, 2.0))
        blas.alloc_ctx_tensors(ctx)
        a.set(x)
        b.set(y)
        with pytest.raises(UnsupportedOpError, match="SCALE"):
            pyggml.compare_graph_backend(gs, cpu, blas)      # BLAS has no SCALE
        g1 = pyggml.Graph(ctx)
        g1.build_forward_expand(mm)
        res = pyggml.compare_graph_backend(g1, cpu, blas, tolerance=1e-10)
        (node,) = res["nodes"]
        assert node["op"] == "MUL_MAT" and node["compared"] and node["nmse"] < 1e-10
        strict = pyggml.compare_graph_backend(g1, cpu, blas, tolerance=0.0)
        # two different GEMMs (ggml's F16-rounded-free F32 kernel and OpenBLAS) differ in bits
        assert strict["first_diverging"] is not None and strict["first_diverging"]["index"] == 0


def test_compare_graph_backend_refuses_what_ggml_would_crash_on():
    with pyggml.Backend("CPU") as one, pyggml.Backend("CPU") as two:
        with pyggml.Context(1 << 20) as pool:
            t = pool.from_numpy(f32(4))
            g = pyggml.Graph(pool)
            g.build_forward_expand(pyggml.add(pool, t, t))
            with pytest.raises(ArgumentError, match="pool, not a backend buffer"):
                pyggml.compare_graph_backend(g, one, two)
            with pytest.raises(ArgumentError, match="two different backends"):
                pyggml.compare_graph_backend(g, one, one)
            with pytest.raises(ArgumentError, match="tolerance"):
                pyggml.compare_graph_backend(g, one, two, tolerance=-1)
        with pyggml.Context(1 << 20, no_alloc=True) as ctx:
            a, b, mm, out, g = _mm_graph(ctx, K=4, M=3, N=2)
            with pytest.raises(ArgumentError, match="without data"):
                pyggml.compare_graph_backend(g, one, two)
