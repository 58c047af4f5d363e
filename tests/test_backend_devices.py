"""One device of the linked ggml, through every path of pyggml's backend layer: tensors in
the device's buffers, ``set``/``get``, the zero-copy views (refused for device memory), the
graph allocator, the scheduler over [device, CPU], ``compare_graph_backend`` against the
CPU, and ``supports_op``'s refusals.

The device: ``PYGGML_TEST_DEVICE`` (``scripts/gpu_check.sh`` sets it to ``CUDA0``), else each
device of the build that is not the CPU or the BLAS backend (a GPU), else the CPU itself,
so that these tests run in every build: on the CPU they check the host side of the same
paths."""

import os

import numpy as np
import pytest

import pyggml
from pyggml import Type, reference
from pyggml.errors import ArgumentError, ExportError, UnsupportedOpError

_DEVS = pyggml.backends()


def _under_test() -> list[str]:
    env = os.environ.get("PYGGML_TEST_DEVICE")
    if env:
        return [env]
    gpus = [d["name"] for d in _DEVS if d["type"] not in ("cpu",) and d["name"] != "BLAS"]
    return gpus or ["CPU"]


DEVICES = _under_test()


@pytest.fixture(params=DEVICES, scope="module")
def device(request):
    name = request.param
    assert name in {d["name"] for d in _DEVS}, f"{name} is not among this build's devices"
    be = pyggml.Backend(name)
    yield be
    be.close()


def _info(be) -> dict:
    return next(d for d in _DEVS if d["name"] == be.name)


def _is_host(be) -> bool:
    return _info(be)["type"] == "cpu"


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_the_device_reports_its_memory(device):
    d = _info(device)
    if d["type"] == "gpu":
        assert d["memory_total"] > 0 and 0 < d["memory_free"] <= d["memory_total"]
    assert d["description"]


@pytest.mark.parametrize("typ,dtype", [(Type.F32, np.float32), (Type.F16, np.float16), (Type.I32, np.int32)])
def test_set_then_get_returns_the_same_values_from_device_buffers(device, typ, dtype):
    src = (np.random.default_rng(3).standard_normal((7, 33)) * 100).astype(dtype)
    with pyggml.Context(1 << 16, no_alloc=True) as ctx:
        t = ctx.new_tensor(typ, (33, 7))
        st = device.alloc_ctx_tensors(ctx)
        assert st is not None
        t.set(src)
        got = t.get()
        assert got.dtype == dtype and got.shape == (7, 33)
        np.testing.assert_array_equal(got, src)
        if _is_host(device):
            np.testing.assert_array_equal(t.numpy(), src)         # a view of the same bytes
        else:
            with pytest.raises(ArgumentError, match="device memory; copy it with get"):
                t.numpy()
            with pytest.raises(ExportError):
                np.asarray(t)


def test_a_graph_computed_on_the_device_matches_float64(device):
    x, y = f32(48, 64), f32(40, 64, seed=1)
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, (64, 48))
        b = ctx.new_tensor(Type.F32, (64, 40))
        out = pyggml.add(ctx, pyggml.mul_mat(ctx, a, b), pyggml.scale(ctx, pyggml.mul_mat(ctx, a, b), 0.5))
        g = pyggml.Graph(ctx)
        g.build_forward_expand(out)
        assert device.supports_op(out)
        device.alloc_ctx_tensors(ctx)
        a.set(x)
        b.set(y)
        device.graph_compute(g)
        got = out.get()
    want = 1.5 * (y.astype(np.float64) @ x.astype(np.float64).T)
    assert reference.nmse(got, want) < 1e-6


def test_the_graph_allocator_places_a_graph_in_device_memory(device):
    x = f32(16, 32)
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, (32, 16))
        device.alloc_ctx_tensors(ctx)                          # the leaf, in the device's buffer
        a.set(x)
        with pyggml.Context(1 << 20, no_alloc=True) as gctx:
            y = pyggml.sqr(gctx, pyggml.relu(gctx, a))
            g = pyggml.Graph(gctx)
            g.build_forward_expand(y)
            galloc = pyggml.GraphAllocator(device)
            assert galloc.alloc_graph(g) >= y.nbytes
            device.graph_compute(g)
            np.testing.assert_allclose(y.get(), np.maximum(x, 0) ** 2, rtol=1e-6)
            if not _is_host(device):
                with pytest.raises(ArgumentError, match="device memory"):
                    y.numpy()


def test_the_scheduler_over_the_device_and_the_cpu_computes_as_float64(device):
    x, y = f32(48, 64), f32(40, 64, seed=1)
    cpu = pyggml.Backend("CPU", n_threads=2)
    sched = pyggml.Scheduler([device, cpu])
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, (64, 48))
        b = ctx.new_tensor(Type.F32, (64, 40))
        mm = pyggml.mul_mat(ctx, a, b)
        out = pyggml.soft_max(ctx, mm)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(out)
        sched.alloc_graph(g)
        a.set(x)
        b.set(y)
        sched.graph_compute(g)
        assert sched.n_splits >= 1
        assert sched.backend_of(mm) is device              # the first backend takes what it can
        got = out.get()
    s = y.astype(np.float64) @ x.astype(np.float64).T
    e = np.exp(s - s.max(axis=1, keepdims=True))
    assert reference.nmse(got, e / e.sum(axis=1, keepdims=True)) < 1e-10


def test_compare_graph_backend_finds_the_device_and_the_cpu_agree(device):
    cpu = pyggml.Backend("CPU")
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, (64, 32))
        b = ctx.new_tensor(Type.F32, (64, 16))
        out = pyggml.gelu(ctx, pyggml.rms_norm(ctx, pyggml.mul_mat(ctx, a, b), 1e-5))
        g = pyggml.Graph(ctx)
        g.build_forward_expand(out)
        device.alloc_ctx_tensors(ctx)
        a.set(f32(32, 64))
        b.set(f32(16, 64, seed=2))
        res = pyggml.compare_graph_backend(g, device, cpu, tolerance=1e-6)
    compared = [n for n in res["nodes"] if n["compared"]]
    assert [n["op"] for n in compared] == ["MUL_MAT", "RMS_NORM", "GELU"]
    assert res["first_diverging"] is None, res


def test_a_node_the_device_cannot_compute_is_refused_before_ggml_sees_it(device):
    """FLASH_ATTN_BACK (ggml's CPU kernel only) or, failing that, the first op of a short
    list the device's supports_op refuses: graph_compute raises UnsupportedOpError."""
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        q = ctx.new_tensor(Type.F32, (16, 4, 2, 1))
        k = ctx.new_tensor(Type.F32, (16, 8, 2, 1))
        v = ctx.new_tensor(Type.F32, (8, 16, 2, 1))      # transposed: [M, D]
        d = ctx.new_tensor(Type.F32, (16, 4, 2, 1))
        candidates = [pyggml.flash_attn_back(ctx, q, k, v, d, False)]
        refused = [n for n in candidates if not device.supports_op(n)]
        if not refused:
            pytest.skip(f"{device.name} computes every candidate node")
        node = refused[0]
        g = pyggml.Graph(ctx)
        g.build_forward_expand(node)
        device.alloc_ctx_tensors(ctx)
        with pytest.raises(UnsupportedOpError, match=f"{device.name} cannot compute node"):
            device.graph_compute(g)
