import gc
import weakref

import numpy as np
import pytest

import pyggml
from pyggml import Type


def test_context_reports_sizes():
    with pyggml.Context(1 << 20) as ctx:
        assert ctx.mem_size == 1 << 20
        assert ctx.used_mem == 0
        t = ctx.new_tensor(Type.F32, (10,))
        # one object header + tensor header + 40 bytes of data, padded to MEM_ALIGN
        used = ctx.used_mem
        assert used >= 40
        ctx.new_tensor(Type.F32, (10,))
        assert ctx.used_mem == 2 * used
        assert t.nbytes == 40


def test_no_alloc_context_uses_only_headers():
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        ctx.new_tensor(Type.F32, (10,))
        small = ctx.used_mem
        ctx.new_tensor(Type.F32, (100000,))
        assert ctx.used_mem == 2 * small


@pytest.mark.parametrize("bad, exc, match", [
    (0, ValueError, "mem_size must be > 0"),
    (-5, ValueError, "mem_size must be > 0"),
    (1.5, TypeError, "mem_size must be an int"),
    ("10", TypeError, "mem_size must be an int"),
    (True, TypeError, "mem_size must be an int"),
    (1 << 70, MemoryError, "too large"),
])
def test_context_bad_mem_size(bad, exc, match):
    with pytest.raises(exc, match=match):
        pyggml.Context(bad)


def test_close_is_idempotent_and_tensors_raise():
    ctx = pyggml.Context(1 << 20)
    t = ctx.new_tensor(Type.F32, (4,))
    ctx.close()
    ctx.close()
    assert ctx.closed
    for use in (lambda: t.ne, lambda: t.numpy(), lambda: t.name, lambda: t.src):
        with pytest.raises(ValueError, match="context was closed"):
            use()
    with pytest.raises(ValueError, match="the context is closed"):
        ctx.new_tensor(Type.F32, (4,))
    with pytest.raises(ValueError, match="the context is closed"):
        ctx.used_mem
    with pytest.raises(ValueError, match="closed"):
        pyggml.add(ctx, t, t)
    with pytest.raises(ValueError, match="closed"):
        with ctx:
            pass


def test_numpy_view_outlives_context():
    with pyggml.Context(1 << 20) as ctx:
        t = ctx.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        view = t.numpy()
    del ctx, t
    gc.collect()
    # the pool is still alive: the view reads and writes the original data
    np.testing.assert_array_equal(view, np.arange(6, dtype=np.float32).reshape(2, 3))
    view[1, 2] = 42.0
    assert view[1, 2] == 42.0


def test_pool_freed_when_last_view_goes():
    ctx = pyggml.Context(1 << 20)
    view = ctx.from_numpy(np.ones(3, dtype=np.float32)).numpy()
    pool = weakref.ref(view.base)
    ctx.close()
    assert pool() is not None
    del view
    gc.collect()
    assert pool() is None


def test_tensor_that_does_not_fit_raises_memory_error():
    with pyggml.Context(4096) as ctx:
        with pytest.raises(MemoryError, match="new_tensor needs"):
            ctx.new_tensor(Type.F32, (4096,))
        # the failed call changed nothing; a small tensor still fits
        assert ctx.used_mem == 0
        ctx.new_tensor(Type.F32, (4,))


def test_exact_fit_is_allowed():
    probe = pyggml.Context(1 << 20)
    probe.new_tensor(Type.F32, (100,))
    need = probe.used_mem
    with pyggml.Context(need) as ctx:
        ctx.new_tensor(Type.F32, (100,))
        with pytest.raises(MemoryError):
            ctx.new_tensor(Type.F32, (1,))


def test_op_result_that_does_not_fit_raises_memory_error():
    probe = pyggml.Context(1 << 20)
    probe.new_tensor(Type.F32, (1000,))
    one = probe.used_mem
    with pyggml.Context(one + 100) as ctx:
        a = ctx.new_tensor(Type.F32, (1000,))
        with pytest.raises(MemoryError, match="add needs"):
            pyggml.add(ctx, a, a)
        with pytest.raises(MemoryError, match="transpose needs"):
            pyggml.transpose(ctx, a)


def test_graph_that_does_not_fit_raises_memory_error():
    with pyggml.Context(pyggml.Graph.overhead(16) - 1) as ctx:
        with pytest.raises(MemoryError, match=r"Graph\(size=16\) needs"):
            pyggml.Graph(ctx, 16)
    with pyggml.Context(pyggml.Graph.overhead(16)) as ctx:
        pyggml.Graph(ctx, 16)


def test_huge_tensor_is_refused_before_c():
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(ValueError, match="does not fit int64|more elements than int64"):
            ctx.new_tensor(Type.F32, (1 << 40, 1 << 40))
        with pytest.raises(ValueError, match="more bytes than a context can hold"):
            ctx.new_tensor(Type.F32, (1 << 31, 1 << 31))
        with pytest.raises(MemoryError):
            ctx.new_tensor(Type.F32, (1 << 20, 1 << 20))


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
@pytest.mark.parametrize("typ, n", [(Type.F32, 1 << 62), (Type.F64, 1 << 61), (Type.F32, (1 << 61) + 1)])
def test_a_single_row_past_int64_bytes_is_refused(typ, n, no_alloc):
    """2**62 floats in ne[0] alone wrapped the byte count to 0: a tensor of 2**62 elements
    and no data, in a pool context as in a no_alloc one"""
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        with pytest.raises(pyggml.ArgumentError, match="more bytes than a context can hold"):
            ctx.new_tensor(typ, (n,))
        assert ctx.new_tensor(typ, (n // 8 if no_alloc else 16,)).ne[0] == (n // 8 if no_alloc else 16)


def test_repr():
    ctx = pyggml.Context(1 << 20)
    assert "used=0" in repr(ctx)
    ctx.close()
    assert "closed" in repr(ctx)


def test_version_and_build_info():
    info = pyggml.build_info()
    assert info["ggml_version"] == pyggml.ggml_version()
    assert pyggml.ggml_version().count(".") == 2
    assert info["mem_align"] == pyggml.MEM_ALIGN
    assert pyggml.MEM_ALIGN in (4, 8, 16, 32, 64)
    system = info["ggml_source"].startswith("system:")
    assert info["ggml_source"].split(":")[0] in ("pypi", "src", "system")
    assert info["native"] is None if system else isinstance(info["native"], bool)
    # a system ggml's OpenMP is seen from the libraries loaded (pyggml did not build it)
    assert isinstance(info["openmp"], bool) and info["openmp"] == pyggml._cpu.OPENMP
    assert set(info["features"]) == {"ggml_version", "flash_attn_back", "use_ref", "rope_imrope", "rpc"}
    # ggml's RPC backend: in a vendored build unless PYGGML_RPC=OFF; a prebuilt ggml's, if it has one
    assert info["features"]["rpc"] == (pyggml.rpc_protocol() is not None)


def test_vendored_build_reports_the_pinned_version():
    from sources import lock_source, read_lock
    info = pyggml.build_info()
    if not info["ggml_source"].startswith("pypi:"):
        pytest.skip("built from another ggml source")
    lock = read_lock()
    assert info["ggml_source"] == lock_source()
    assert pyggml.ggml_version() == lock["version"]
    # a release sdist carries no git commit (and pyggml must not report its own)
    assert info["ggml_commit"] == "unknown"


@pytest.mark.parametrize("before", [0, 1, 3, 17, 100])
@pytest.mark.parametrize("alignment", [16, 64, 256])
def test_align_next_data(before, alignment):
    with pyggml.Context(1 << 20) as ctx:
        if before:
            ctx.new_tensor(Type.I8, (before,))
        ctx._align_next_data(alignment)
        t = ctx.new_tensor(Type.F32, (8,))
        assert t.data_ptr % alignment == 0
        ctx._align_next_data(alignment)      # already aligned: nothing added
        used = ctx.used_mem
        ctx._align_next_data(alignment)
        assert ctx.used_mem == used


def test_align_next_data_errors():
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(ValueError, match="power of two multiple"):
            ctx._align_next_data(48)
    # pools start on a cache line, so where the next data lands mod 64 depends only on
    # what the context holds: find a first tensor that leaves it misaligned
    for n in (1, 17, 33, 49):
        probe = pyggml.Context(1 << 16)
        probe.new_tensor(Type.I8, (n,))
        used = probe.used_mem
        if probe.new_tensor(Type.F32, (1,)).data_ptr % 64:
            break
    else:
        pytest.skip("every layout is already aligned on this platform")
    with pyggml.Context(used + 8) as ctx:
        ctx.new_tensor(Type.I8, (n,))
        with pytest.raises(MemoryError, match="_align_next_data needs"):
            ctx._align_next_data(64)
