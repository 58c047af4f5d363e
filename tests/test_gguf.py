"""pyggml.gguf: GGUF files through ggml's own reader, the tensors zero-copy over a mapping.

gguf-py (llama.cpp's own Python package) is the independent side: it writes the files and
reads them back for the comparison."""

import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pyggml
import pyggml.gguf as pg
from pyggml.errors import ArgumentError, ContextClosedError, GGMLTypeError, GGUFError

gguf = pytest.importorskip("gguf")
from gguf_files import real_model_path, write_gguf as write  # noqa: E402
QT = gguf.GGMLQuantizationType


def raw_view(t):
    """A tensor's zero-copy view: its values, or its blocks' bytes where numpy has no dtype."""
    return t.numpy() if pyggml.Type(int(t.type)).numpy_dtype is not None else t.blocks()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 64), dtype=np.float32)
    q8 = gguf.quants.quantize(a, QT.Q8_0)
    # Q4_K from raw bytes: the block layout read as gguf-py reads it (scales kept finite)
    q4k = rng.integers(0, 256, size=(2, 144), dtype=np.uint8)
    q4k[:, 1] = q4k[:, 3] = 0x3c                     # the f16 d and dmin: 1.0-ish, finite
    tensors = {
        "f32": (a, None),
        "f16": (a.astype(np.float16), None),
        "q8_0": (q8, QT.Q8_0),
        "q4_k": (q4k, QT.Q4_K),
        "vec": (np.arange(5, dtype=np.float32), None),
        "i32": (np.arange(-3, 9, dtype=np.int32).reshape(2, 2, 3), None),
    }
    kv = {
        "t.u8": ("add_uint8", 200), "t.i8": ("add_int8", -100), "t.u16": ("add_uint16", 60000),
        "t.i16": ("add_int16", -30000), "t.u32": ("add_uint32", 4_000_000_000), "t.i32": ("add_int32", -2 ** 31),
        "t.u64": ("add_uint64", 2 ** 63 + 5), "t.i64": ("add_int64", -2 ** 62), "t.f32": ("add_float32", 0.1),
        "t.f64": ("add_float64", 0.1), "t.bool": ("add_bool", True), "t.str": ("add_string", "héllo ☃"),
        "t.strs": ("add_array", ["a", "", "ü"]), "t.floats": ("add_array", [1.5, -2.0, 3.25]),
        "t.ints": ("add_array", [1, -2, 3]),
    }
    path = write(tmp_path_factory.mktemp("gguf") / "sample.gguf", tensors, kv)
    return path, tensors


def test_metadata_and_layout_agree_with_gguf_py(sample):
    path, _ = sample
    r = gguf.GGUFReader(str(path))
    with pg.load(path) as f:
        assert f.version == 3 and f.alignment == 32 and f.file_size == os.path.getsize(path)
        assert f.data_offset == r.data_offset
        assert list(f.metadata) == [fld.name for fld in r.fields.values() if not fld.name.startswith("GGUF.")]
        for fld in r.fields.values():
            if fld.name.startswith("GGUF."):
                continue
            want = fld.contents()
            got = f.metadata[fld.name]
            if isinstance(got, np.ndarray):
                assert got.tolist() == pytest.approx(want) and got.flags.writeable
            elif isinstance(want, float):
                assert got == pytest.approx(want, rel=1e-7)
            else:
                assert got == want, fld.name
        assert type(f.metadata["t.u64"]) is int and f.metadata["t.u64"] == 2 ** 63 + 5
        assert f.metadata["t.f64"] == 0.1 and f.metadata["t.f32"] == np.float32(0.1)
        assert f.metadata["t.floats"].dtype == np.float32 and f.metadata["t.ints"].dtype == np.int32
        assert [t.name for t in r.tensors] == list(f.tensors)
        for rt in r.tensors:
            t = f.tensors[rt.name]
            assert t.name == rt.name and int(t.type) == int(rt.tensor_type)
            assert t.ne[:len(rt.shape)] == tuple(int(x) for x in rt.shape)      # gguf-py: ggml order


def test_tensors_are_the_file_bytes_in_place(sample):
    path, tensors = sample
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    r = gguf.GGUFReader(str(path))
    with pg.load(path) as f:
        for rt in r.tensors:
            t = f.tensors[rt.name]
            start = int(rt.data_offset)
            got = raw_view(t)
            assert got.tobytes() == raw[start:start + rt.n_bytes].tobytes(), rt.name
            base = got
            while isinstance(base.base, np.ndarray):
                base = base.base
            assert isinstance(base.base, pyggml.Storage)       # a view of the mapping, no copy
            assert base.base.size == os.path.getsize(path)
        assert np.array_equal(f.tensors["f32"].numpy(), tensors["f32"][0])
        assert f.tensors["vec"].shape == (5,) and f.tensors["i32"].shape == (2, 2, 3)
        assert np.array_equal(f.tensors["i32"].numpy(), tensors["i32"][0])
        assert np.array_equal(pyggml.dequantize(QT.Q4_K, f.tensors["q4_k"].blocks(), (2, 256)),
                              gguf.quants.dequantize(tensors["q4_k"][0], QT.Q4_K))


def test_a_graph_reads_the_weights_where_they_lie(sample):
    """mul_mat of a quantized weight of the file against float64 over its dequantized
    values, through the CPU executor and through a Backend with the graph allocator."""
    path, tensors = sample
    w64 = gguf.quants.dequantize(tensors["q8_0"][0], QT.Q8_0).astype(np.float64)
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    want = x.astype(np.float64) @ w64.T
    with pg.load(path) as f:
        with pyggml.Context(1 << 20) as ctx:
            y = pyggml.mul_mat(ctx, f.tensors["q8_0"], ctx.from_numpy(x))
            g = pyggml.Graph(ctx)
            g.build_forward_expand(y)
            g.compute(1)
            assert pyggml.reference.nmse(y.numpy(), want) < 1e-4       # x is quantized to Q8_0 too
        cpu = pyggml.Backend("CPU")
        with pyggml.Context(1 << 20, no_alloc=True) as ctx:
            xt = ctx.new_tensor(pyggml.Type.F32, [64, 2])
            y = pyggml.mul_mat(ctx, f.tensors["f32"], xt)
            g = pyggml.Graph(ctx)
            g.build_forward_expand(y)
            pyggml.GraphAllocator(cpu).alloc_graph(g)
            xt.set(x)
            cpu.graph_compute(g)
            assert pyggml.reference.nmse(y.get(), x.astype(np.float64) @ tensors["f32"][0].T.astype(np.float64)) < 1e-12


def test_writes_change_this_process_copy_never_the_file(sample):
    path, tensors = sample
    before = path.read_bytes()
    with pg.load(path) as f:
        f.tensors["f32"].numpy()[:] = 0
        assert not f.tensors["f32"].numpy().any()
    assert path.read_bytes() == before
    with pg.load(path) as f:
        assert np.array_equal(f.tensors["f32"].numpy(), tensors["f32"][0])


def _mapped(path):
    with open("/proc/self/maps") as m:
        return sum(str(path) in line for line in m)


def test_the_mapping_lives_while_a_view_does_and_goes_after(sample):
    path, tensors = sample
    import gc
    gc.collect()
    assert _mapped(path) == 0
    f = pg.load(path)
    view = f.tensors["vec"].numpy()
    t = f.tensors["f32"]
    assert _mapped(path) == 1
    f.close()
    with pytest.raises(ContextClosedError):
        t.numpy()
    del f, t
    gc.collect()
    assert _mapped(path) == 1 and view.tolist() == [0, 1, 2, 3, 4]      # the view holds the mapping
    del view
    gc.collect()
    assert _mapped(path) == 0


def test_a_file_without_tensors(tmp_path):
    path = write(tmp_path / "meta.gguf", kv={"k": ("add_string", "v")})
    with pg.load(path) as f:
        assert f.tensors == {} and f.metadata == {"general.architecture": "tiny", "k": "v"}
    assert _mapped(path) == 0


# --- bad files: named errors, never a crash -----------------------------------------------

@pytest.mark.parametrize("mutate, match", [
    (lambda b: b"", "failed to read magic"),
    (lambda b: b"GGUX" + b[4:], "invalid magic"),
    (lambda b: b[:4] + struct.pack("<I", 99) + b[8:], "version 99"),
    (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "GGUFv1 is no longer supported"),
    (lambda b: b[:18], "failed to read header"),
    (lambda b: b[:8] + struct.pack("<q", -1) + b[16:], None),             # n_tensors negative
    (lambda b: b[:16] + struct.pack("<q", 2 ** 40) + b[24:], None),       # n_kv absurd
])
def test_a_bad_header_is_a_named_error(sample, tmp_path, mutate, match):
    path, _ = sample
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(GGUFError, match=match) as info:
        pg.load(bad)
    assert "ggml's reader refuses it" in str(info.value) and isinstance(info.value, ValueError)


def test_data_past_the_end_is_refused_before_anything_is_mapped(sample, tmp_path):
    path, _ = sample
    data = path.read_bytes()
    last = gguf.GGUFReader(str(path)).tensors[-1]
    bad = tmp_path / "short.gguf"
    bad.write_bytes(data[:int(last.data_offset) + 4])      # the last tensor's data cut short; ggml reads none
    with pytest.raises(GGUFError, match=r"tensor 'i32' .* past the end of the file"):
        pg.load(bad)
    assert _mapped(bad) == 0


def test_an_unknown_tensor_type_is_refused(sample, tmp_path):
    path, _ = sample
    r = gguf.GGUFReader(str(path))
    data = bytearray(path.read_bytes())
    # the type field of tensor "f32": in its info record, after the name, n_dims and dims
    name = b"f32"
    at = data.index(struct.pack("<Q", len(name)) + name)
    at += 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    at += 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, at)[0] == 0          # F32
    struct.pack_into("<I", data, at, 200)
    bad = tmp_path / "type.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="type"):
        pg.load(bad)


def test_a_missing_file_and_a_wrong_argument():
    with pytest.raises(FileNotFoundError):
        pg.load("/nonexistent/x.gguf")
    with pytest.raises(GGMLTypeError, match="path must be"):
        pg.load(None)
    with pytest.raises(GGUFError):
        pg.load("/dev/null")


FUZZ = textwrap.dedent(r'''
    import random, sys
    import pyggml, pyggml.gguf as pg
    from pyggml.errors import GGMLAbort, GGUFError
    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = open(src, "rb").read()
    rng = random.Random(11)
    outcomes = {"loaded": 0, "GGUFError": 0, "GGMLAbort": 0}
    for i in range(n):
        b = bytearray(data)
        kind = i % 4
        if kind == 0:                                  # flip bytes of the header and infos
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(min(len(b), 700))] = rng.randrange(256)
        elif kind == 1:                                # truncate anywhere
            del b[rng.randrange(len(b)):]
        elif kind == 2:                                # an absurd 64-bit count or length
            at = rng.randrange(0, min(len(b), 700) - 8)
            b[at:at + 8] = rng.choice([2 ** 63 - 1, 2 ** 32, 2 ** 62, 0xFFFFFFFFFFFFFFFF]).to_bytes(8, "little")
        else:                                          # random bytes after a valid magic
            b = bytearray(b"GGUF" + bytes(rng.randrange(256) for _ in range(rng.randrange(64))))
        open(out, "wb").write(b)
        try:
            f = pg.load(out)
            for t in f.tensors.values():
                (t.numpy() if pyggml.Type(int(t.type)).numpy_dtype is not None else t.blocks()).tobytes()
            f.close()
            outcomes["loaded"] += 1
        except (GGUFError, GGMLAbort) as e:
            outcomes[type(e).__name__] += 1
    print(outcomes)
''')


def test_mutated_files_end_in_a_named_error_or_a_load_never_a_crash(sample, tmp_path):
    """400 mutations of a valid file (bytes flipped, truncations, absurd counts, random
    bodies) in a fresh interpreter: each loads (and its tensors read) or raises GGUFError
    or GGMLAbort; the interpreter exits cleanly. (ggml 0.9.4's reader throws
    std::bad_alloc for an absurd count: a GGUFError too.)"""
    path, _ = sample
    proc = subprocess.run([sys.executable, "-c", FUZZ, str(path), str(tmp_path / "m.gguf"), "400"],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = eval(proc.stdout.strip().splitlines()[-1])
    assert sum(outcomes.values()) == 400 and outcomes["GGUFError"] > 100, outcomes


# --- writing: ggml's own writer ------------------------------------------------------------

def test_saving_what_was_loaded_writes_the_same_bytes(sample, tmp_path):
    path, _ = sample
    with pg.load(path) as f:
        assert f.types["t.u64"] == "uint64" and f.types["t.strs"] == "array[string]"
        assert f.types["t.floats"] == "array[float32]" and f.types["general.architecture"] == "string"
        pg.save(tmp_path / "again.gguf", f.tensors, f.metadata, f.types)
    assert (tmp_path / "again.gguf").read_bytes() == path.read_bytes()


def test_saving_infers_types_and_gguf_py_reads_the_file(tmp_path):
    meta = {"a": 1, "big": 2 ** 40, "huge": 2 ** 63, "b": 2.5, "c": "s☃", "d": [1, -2], "e": ["x", "y"],
            "f": np.uint16(7), "g": True, "h": np.arange(3, dtype=np.int8), "i": [0.5, 1]}
    with pyggml.Context(1 << 20) as ctx:
        x = ctx.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        x.name = "x"
        w = named(ctx.from_numpy(pyggml.quantize(pyggml.Type.Q8_0, np.ones((2, 32), np.float32)),
                                 type=pyggml.Type.Q8_0), "w")
        pg.save(tmp_path / "s.gguf", {"x": x, "w": w}, meta)
    with pg.load(tmp_path / "s.gguf") as f:
        assert f.types == {"a": "int32", "big": "int64", "huge": "uint64", "b": "float32", "c": "string",
                           "d": "array[int32]", "e": "array[string]", "f": "uint16", "g": "bool",
                           "h": "array[int8]", "i": "array[float32]"}
        assert f.metadata["huge"] == 2 ** 63 and f.metadata["c"] == "s☃" and f.metadata["d"].tolist() == [1, -2]
        assert np.array_equal(f.tensors["x"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    r = gguf.GGUFReader(str(tmp_path / "s.gguf"))
    assert r.fields["c"].contents() == "s☃" and [t.name for t in r.tensors] == ["x", "w"]
    assert np.array_equal(np.asarray(r.tensors[1].data).reshape(-1),
                          pyggml.quantize(pyggml.Type.Q8_0, np.ones((2, 32), np.float32)).reshape(-1))


@pytest.mark.parametrize("args, cls, match", [
    (lambda ctx, t: ([t, t], {}), ArgumentError, "two tensors named"),
    (lambda ctx, t: ({"other": t}, {}), ArgumentError, "is not the tensor's name"),
    (lambda ctx, t: ([ctx.new_tensor(pyggml.Type.F32, [4])], {}), ArgumentError, "without a name"),
    (lambda ctx, t: ([t], {"k": 2 ** 64}), GGMLTypeError, "no GGUF type for a int"),
    (lambda ctx, t: ([t], {"k": object()}), GGMLTypeError, "no GGUF type"),
    (lambda ctx, t: ([t], {"k": "a\0b"}), ArgumentError, "NUL"),
    (lambda ctx, t: ([t], {"general.alignment": 24}), ArgumentError, "power of two"),
    (lambda ctx, t: ([t], {"k": 300}, {"k": "uint8"}), ArgumentError, "300 does not fit uint8"),
    (lambda ctx, t: ([t], {"k": [1.5]}, {"k": "array[int32]"}), GGMLTypeError, "cannot be written as int32"),
    (lambda ctx, t: ([t], {"k": 1}, {"k": "complex"}), ArgumentError, "unknown GGUF type"),
    (lambda ctx, t: ([t], {"k": [[1, 2]]}, {"k": "array[int32]"}), ArgumentError, "one-dimensional"),
    (lambda ctx, t: ([t], {"": 1}), GGMLTypeError, "non-empty str"),
    (lambda ctx, t: (t, {}), GGMLTypeError, "sequence or a mapping"),
    (lambda ctx, t: ([named(pyggml.transpose(ctx, t))], {}), ArgumentError, "not contiguous"),
])
def test_saving_refuses_what_ggml_would_abort_on_or_misread(tmp_path, args, cls, match):
    with pyggml.Context(1 << 20) as ctx:
        t = named(ctx.from_numpy(np.ones((2, 3), np.float32)))
        call = args(ctx, t)
        with pytest.raises(cls, match=match):
            pg.save(tmp_path / "x.gguf", *call)
    assert not (tmp_path / "x.gguf").exists()


def named(t, name="t"):
    t.name = name
    return t


def test_saving_where_ggml_cannot_write_and_tensors_without_data(tmp_path):
    with pyggml.Context(1 << 20) as ctx:
        t = named(ctx.from_numpy(np.ones(4, np.float32)))
        with pytest.raises(GGUFError, match="failed to open"):
            pg.save(tmp_path / "no" / "such" / "dir.gguf", [t])
    with pytest.raises(ContextClosedError):
        pg.save(tmp_path / "closed.gguf", [t])
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        with pytest.raises(ArgumentError, match="has no data"):
            pg.save(tmp_path / "nodata.gguf", [named(ctx.new_tensor(pyggml.Type.F32, [4]))])


# --- the real model, where its package is installed ----------------------------------------

def test_the_gemma3_file_loads_zero_copy_and_agrees_with_gguf_py(tmp_path_factory):
    path = real_model_path(tmp_path_factory)
    r = gguf.GGUFReader(str(path))
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    with pg.load(path) as f:
        assert f.metadata["general.architecture"] == "gemma3" and len(f.tensors) == len(r.tensors) == 236
        assert f.metadata["gemma3.block_count"] == 18 and len(f.metadata["tokenizer.ggml.tokens"]) == 262144
        assert f.metadata["tokenizer.ggml.tokens"] == list(r.fields["tokenizer.ggml.tokens"].contents())
        types = set()
        for rt in r.tensors:
            t = f.tensors[rt.name]
            types.add(pyggml.Type(int(t.type)).name)
            got = raw_view(t)
            start = int(rt.data_offset)
            assert np.array_equal(got.reshape(-1).view(np.uint8), raw[start:start + rt.n_bytes]), rt.name
        assert types == {"F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"}
        # ggml's writer gives back the very file (written by llama.cpp's gguf-py)
        pg.save(tmp_path_factory.mktemp("again") / "gemma3.gguf", f.tensors, f.metadata, f.types)
    import hashlib
    again = next(p for p in (tmp_path_factory.getbasetemp()).glob("again*/gemma3.gguf"))
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()


def test_a_context_built_on_the_weights_holds_the_mapping_after_the_file_closes(sample):
    """Closing the GGUFFile while another context's graph uses its tensors: that context
    holds the mapping (docs/ownership.md), so the graph computes the right values, and the
    mapping goes with that context."""
    import gc
    path, tensors = sample
    f = pg.load(path)
    ctx = pyggml.Context(1 << 20)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    y = pyggml.mul_mat(ctx, f.tensors["f32"], ctx.from_numpy(x))
    g = pyggml.Graph(ctx)
    g.build_forward_expand(y)
    f.close()
    del f
    gc.collect()
    assert _mapped(path) == 1
    g.compute(1)
    want = x.astype(np.float64) @ tensors["f32"][0].T.astype(np.float64)
    assert pyggml.reference.nmse(y.numpy(), want) < 1e-12
    ctx.close()
    del g, y
    gc.collect()
    assert _mapped(path) == 0
