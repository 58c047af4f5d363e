"""The array protocols: np.asarray (numpy's __array__) and DLPack (__dlpack__,
__dlpack_device__, Context.from_dlpack). Zero-copy out of host memory, memory kept alive
after the context closes, and ExportError (a BufferError) for what has no such view."""

import gc

import numpy as np
import pytest

import pyggml
from pyggml import Type


@pytest.fixture
def ctx():
    with pyggml.Context(1 << 20) as c:
        yield c


def values(shape, dtype=np.float32):
    return np.arange(np.prod(shape), dtype=dtype).reshape(shape) - 3


def test_asarray_is_the_tensor_s_memory(ctx):
    t = ctx.from_numpy(values((3, 4)))
    a = np.asarray(t)
    assert a.shape == (3, 4) and a.dtype == np.float32
    assert np.shares_memory(a, t.numpy())
    a[1, 2] = 100.0
    assert t.numpy()[1, 2] == 100.0


def test_asarray_honours_numpy_2_s_copy_and_dtype(ctx):
    t = ctx.from_numpy(values((2, 3)))
    copied = np.asarray(t, copy=True)
    assert not np.shares_memory(copied, t.numpy()) and np.array_equal(copied, t.numpy())
    as64 = np.asarray(t, dtype=np.float64)
    assert as64.dtype == np.float64 and np.array_equal(as64, values((2, 3)).astype(np.float64))
    assert np.shares_memory(np.asarray(t, dtype=np.float32, copy=False), t.numpy())
    with pytest.raises(pyggml.ArgumentError, match="copy=False.*float64 needs a copy"):
        np.asarray(t, dtype=np.float64, copy=False)


def test_np_from_dlpack_is_zero_copy_and_outlives_the_context():
    with pyggml.Context(1 << 20) as c:
        t = c.from_numpy(values((2, 5)))
        a = np.from_dlpack(t)
        assert np.shares_memory(a, t.numpy())
        assert t.__dlpack_device__() == (1, 0)
    del t, c
    gc.collect()
    assert np.array_equal(a, values((2, 5)))        # the pool lives on in the capsule's array


def test_a_strided_view_goes_out_with_its_strides(ctx):
    t = ctx.from_numpy(values((3, 4)))
    v = pyggml.transpose(ctx, t)
    a = np.from_dlpack(v)
    assert a.shape == (4, 3) and np.array_equal(a, values((3, 4)).T)
    assert np.shares_memory(a, t.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8])
def test_torch_takes_a_tensor_without_a_copy(dtype):
    torch = pytest.importorskip("torch")
    with pyggml.Context(1 << 20) as c:
        t = c.from_numpy(values((2, 3), dtype))
        x = torch.from_dlpack(t)
        assert tuple(x.shape) == (2, 3) and x.data_ptr() == t.numpy().ctypes.data
        x[0, 1] = 42
        assert t.numpy()[0, 1] == 42
    del t, c
    gc.collect()
    expect = values((2, 3), dtype)
    expect[0, 1] = 42
    assert np.array_equal(x.numpy(), expect)        # alive after the context closed


@pytest.mark.parametrize("make, why", [
    (lambda c: c.new_tensor(Type.Q8_0, (32, 2)), "Q8_0 tensor has no element dtype"),
    (lambda c: c.new_tensor(Type.BF16, (4,)), "numpy has no BF16 dtype"),
])
def test_what_has_no_element_view_is_refused_by_name(ctx, make, why):
    t = make(ctx)
    for export in (np.asarray, np.from_dlpack, lambda x: x.__dlpack_device__()):
        with pytest.raises(pyggml.ExportError, match=why) as e:
            export(t)
        assert isinstance(e.value, BufferError) and isinstance(e.value, pyggml.GGMLError)


def test_a_tensor_without_data_is_refused():
    with pyggml.Context(1 << 16, no_alloc=True) as c:
        t = c.new_tensor(Type.F32, (4,))
        with pytest.raises(pyggml.ExportError, match="__dlpack__: "):
            t.__dlpack__()


def test_a_closed_context_s_tensor_is_refused():
    with pyggml.Context(1 << 16) as c:
        t = c.new_tensor(Type.F32, (4,))
    with pytest.raises(pyggml.ContextClosedError):
        np.asarray(t)


def test_from_dlpack_copies_any_producer_in(ctx):
    src = values((2, 3))
    t = ctx.from_dlpack(src)
    assert t.type == Type.F32 and t.shape == (2, 3) and np.array_equal(t.numpy(), src)
    assert not np.shares_memory(t.numpy(), src)        # the context's memory is its own
    with pytest.raises(pyggml.GGMLTypeError, match="not a DLPack producer"):
        ctx.from_dlpack([1.0, 2.0])


def test_from_dlpack_takes_a_torch_tensor(ctx):
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = ctx.from_dlpack(x)
    assert np.array_equal(t.numpy(), x.numpy())


def test_a_cpu_backend_buffer_goes_out_zero_copy_and_stays_alive():
    with pyggml.Backend("CPU", n_threads=1) as cpu:
        with pyggml.Context(1 << 16, no_alloc=True) as c:
            t = c.new_tensor(Type.F32, (4, 3))
            cpu.alloc_ctx_tensors(c)
            t.set(values((3, 4)))
            a = np.from_dlpack(t)
            assert t.__dlpack_device__() == (1, 0) and np.shares_memory(a, t.numpy())
        del t, c
    gc.collect()
    assert np.array_equal(a, values((3, 4)))        # the buffer lives on in the array


def test_jax_takes_a_tensor_zero_copy_where_its_alignment_allows():
    jnp = pytest.importorskip("jax.numpy")
    with pyggml.Context(1 << 20) as c:
        c._align_next_data(64)
        aligned = c.from_numpy(values((2, 3)))
        unaligned = c.from_numpy(values((2, 3)))
        while unaligned.data_ptr % 64 == 0:                   # ggml aligns data to 16 bytes only
            unaligned = c.from_numpy(values((2, 3)))
        x, y = jnp.from_dlpack(aligned), jnp.from_dlpack(unaligned)
        assert np.array_equal(np.asarray(x), values((2, 3))) and np.array_equal(np.asarray(y), values((2, 3)))
        assert x.unsafe_buffer_pointer() == aligned.data_ptr          # jax's CPU client wraps 64-aligned memory
        assert y.unsafe_buffer_pointer() != unaligned.data_ptr        # and copies the rest: its choice, not ours
        back = c.from_dlpack(jnp.ones((2, 2), dtype=jnp.float32))
        assert np.array_equal(back.numpy(), np.ones((2, 2), np.float32))
