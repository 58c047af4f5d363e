"""The batch relation of the parity sweep (pyggml.parity.relations): a batch computed in one
graph equals its items computed one by one, bit for bit; it needs no reference, and it
finds ggml's batch defects with pyggml's rules off, on samples that hold no batch."""

import numpy as np
import pytest

import pyggml
from pyggml import Type, parity
from pyggml.defects import present
from pyggml.opinfo import Arg, registry
from pyggml.opinfo import harness
from pyggml.parity import relations
from pyggml.parity.model import compare_outputs

from sources import built_from_the_pin

# probe=False where a test is about a relation: the ggml path's extra out-of-bounds probe
# forks once per case (test_parity_sweep tests it), and a fork of a test worker grown to
# 600 MiB costs about 50 ms on a 2-core VM (this module took 65 s in the serial suite and
# 43 s under -n 2, 10.8 s alone). A graph with a kernel pyggml does not trust is proven all the same.
# On a release other than the pin, ggml itself refuses some samples (skipped rows, with why)
FINE = ("ok", "refused", "skipped")


def test_every_op_of_the_batch_table_is_a_registry_op_whose_arguments_it_fits():
    reg = registry()
    for op, (dims, _) in relations.BATCH.items():
        info = reg[op]
        s = next(iter(info.samples(np.random.default_rng(0), info.types[0])))
        assert len(dims) <= len(s.args), op
        for d, a in zip(dims, s.args):
            assert d is None or a is None or (isinstance(a, Arg) and 0 <= d <= 3), (op, d, a)


def test_a_one_item_sample_becomes_a_batch_of_it_and_two_shuffles():
    info = registry()["conv_2d"]
    s = next(iter(info.samples(np.random.default_rng(3), Type.F32)))
    whole, items = relations.batch_pair(info, s, seed=5)
    b = np.asarray(s.args[1].value)
    assert np.asarray(whole.args[1].value).shape == (3,) + b.shape[1:] and b.shape[0] == 1
    assert np.array_equal(items[0].args[1].value, b)                        # the sample itself first
    assert sorted(np.asarray(items[2].args[1].value).ravel()) == sorted(b.ravel())   # a shuffle of it
    assert not np.array_equal(items[2].args[1].value, b)
    assert all(one.args[0] is s.args[0] for one in items)                  # the kernel is shared
    again, _ = relations.batch_pair(info, s, seed=5)
    assert np.array_equal(again.args[1].value, whole.args[1].value)        # seeded


def test_a_sample_with_a_batch_is_split_and_a_broadcast_operand_passed_whole():
    info = registry()["mul_mat"]
    a = Arg(np.arange(24.0).reshape(1, 1, 4, 6))            # ne3 = 1: broadcast over the batch
    b = Arg(np.arange(36.0).reshape(3, 1, 2, 6))            # a batch of 3
    from pyggml.opinfo import Sample
    whole, items = relations.batch_pair(info, Sample((a, b), "m"), seed=0)
    assert whole.args[1] is b and len(items) == 3
    assert [one.args[0] is a for one in items] == [True] * 3
    assert np.array_equal(items[1].args[1].value, np.arange(36.0).reshape(3, 1, 2, 6)[1:2])
    odd = Sample((Arg(np.zeros((2, 1, 4, 6))), b), "2 against 3")
    assert "not split" in relations.batch_pair(info, odd, seed=0)


def test_batched_and_per_item_agree_bit_for_bit_on_every_op_of_the_table():
    rows = parity.check([f"op:{op}" for op in relations.BATCH], paths=["batched", "per-item"], probe=False)
    assert {(r.a, r.b) for r in rows} == {("batched", "per-item")}
    ok = [r for r in rows if r.verdict == "ok"]
    assert len(ok) > 400 and all(r.nmse == 0.0 and r.tol == 0.0 for r in ok)
    others = [r for r in rows if r.verdict != "ok"]
    assert all(r.verdict == "skipped" or r.verdict == "refused" and r.defect for r in others), \
        {(r.op, r.verdict, r.detail[:80]) for r in others}
    # the relation exposes conv_1d's batch defect on samples that hold one item
    assert {r.defect for r in others if r.op == "conv_1d"} == {"conv-1d-batch-layout"}


def test_the_relation_rows_are_compared_with_each_other_only():
    rows = parity.check("op:rms_norm", quick=True)
    pairs = {(r.a, r.b) for r in rows}
    assert ("batched", "per-item") in pairs
    assert not any(("batched" in p or "per-item" in p) and p != ("batched", "per-item") for p in pairs)
    assert ("ggml", "reference") in pairs


def _relation_with_rules_off(op: str, pick) -> tuple[float, str]:
    """NMSE between the batch and its items computed with pyggml's rules off (ggml's own
    kernels on the input a rule refuses), or the verdict that stopped it."""
    info = registry()[op]
    s = next(x for x in info.samples(np.random.default_rng(0), Type.F32) if pick(x))
    whole, items = relations.batch_pair(info, s, seed=0)
    with harness.rules_disabled():
        try:
            got = relations.as_four(harness.compute(info, whole)[0])
        except pyggml.UpstreamDefect as e:
            return np.inf, e.defect
    per = relations.stack_results(op, [harness.compute(info, one)[0] for one in items], items)
    ref = relations.as_four(harness.reference(info, whole))
    assert compare_outputs([per], [ref])[0] < 1e-6            # the items are right: the batch is wrong
    return compare_outputs([got], [per])[0], ""


def test_the_relation_finds_the_batch_defects_with_the_rules_off():
    """With the rules that refuse them off, the three recorded batch defects break the
    relation on samples of one item: conv_1d's scramble, conv_transpose_2d's zero batches
    (where the linked ggml has it) and FLASH_ATTN_BACK's batch + GQA (whose writes past its
    result the guarded run catches first)."""
    try:
        err, _ = _relation_with_rules_off("conv_1d", lambda s: True)
    except pyggml.GGMLError as e:           # a release whose kernels refuse these samples themselves
        pytest.skip(f"ggml {pyggml.ggml_version()}: {e}")
    assert err > 0.1
    err, _ = _relation_with_rules_off("conv_transpose_2d_p0", lambda s: np.asarray(s.args[1].value).shape[0] == 1)
    if present("conv-transpose-2d-batch"):
        assert err > 0.1
    else:
        assert err == 0.0
    if not pyggml.build_info()["features"]["flash_attn_back"]:
        pytest.skip("this build has no FLASH_ATTN_BACK")
    err, verdict = _relation_with_rules_off("flash_attn_back", lambda s: "H=4 KVH=2" in s.name)
    if present("fab-batch-gqa-oob"):
        assert err > 0.1 and verdict in ("kernel-out-of-bounds", "")
    else:                                   # (a tree patched by scripts/patch_upstream.py)
        assert err == 0.0 and verdict == ""


def test_every_op_is_the_same_bits_on_one_thread_and_on_three_but_those_that_sum_per_thread(monkeypatch):
    """The threads path: ggml's kernels give each result element to one thread, so the
    count changes no bit, but for the two ops that sum per-thread partials; without their
    entries those rows fail (the relation can fail, and these are the ops it fails on)."""
    rows = parity.check(["op:cross_entropy_loss", "op:flash_attn_ext", "op:mul_mat", "op:soft_max_ext"],
                        paths=["ggml", "threads"], probe=False)
    assert {(r.a, r.b) for r in rows} == {("ggml", "threads")}
    assert all(r.verdict in FINE for r in rows)
    exact = [r for r in rows if r.verdict == "ok" and r.op in ("mul_mat", "soft_max_ext")]
    assert len(exact) > 50 and all(r.nmse == 0.0 and r.tol == 0.0 for r in exact)
    if not built_from_the_pin():
        return          # (which cases sum per thread is the pinned kernels' business)
    monkeypatch.setattr(relations, "NOT_BITWISE_ACROSS_THREADS", {})
    rows = parity.check(["op:cross_entropy_loss", "op:flash_attn_ext"], paths=["ggml", "threads"], probe=False)
    failed = {(r.op, r.case) for r in rows if r.verdict == "fail"}
    assert ("cross_entropy_loss", "F32 labels not normalized") in failed
    assert ("flash_attn_ext", "F32 split-KV path: 512 keys") in failed


def test_views_and_their_contiguous_copies_and_in_place_twins_give_the_same_bits(monkeypatch):
    """The contiguous path (every argument made contiguous, same values) and the inplace
    path (the op's _inplace twin) against ggml: bit for bit, but norm on transposed rows,
    whose kernel sums them in another order (without its entry, those rows fail)."""
    rows = parity.check(["op:norm", "op:rms_norm", "op:mul_mat", "op:add", "op:rope"],
                        paths=["ggml", "contiguous", "inplace"], probe=False)
    assert {(r.a, r.b) for r in rows} == {("ggml", "contiguous"), ("ggml", "inplace")}
    assert {r.op for r in rows if r.b == "inplace"} == {"norm", "rms_norm", "add", "rope"}    # mul_mat has none
    assert all(r.verdict in FINE for r in rows), [r.detail for r in rows if r.verdict not in FINE]
    assert sum(r.verdict == "ok" and r.nmse == 0.0 for r in rows) > 100
    # a case with only contiguous arguments has no contiguous row
    cases = {r.case for r in rows if r.b == "contiguous"}
    assert cases and all("contiguous (" not in c for c in cases)
    if not built_from_the_pin():
        return
    monkeypatch.setattr(relations, "NOT_BITWISE_ACROSS_LAYOUTS", {})
    rows = parity.check("op:norm", paths=["ggml", "contiguous"], probe=False)
    assert {r.case for r in rows if r.verdict == "fail"} == {"F32 transposed (5, 4) eps=1e-05", "F32 transposed (5, 4) eps=0"}


def test_a_broadcast_operand_gives_what_it_gives_repeated_and_the_mapping_matters(monkeypatch):
    """The repeated path: mul_mat's broadcast a and attention's GQA k, v repeated to full
    size (head h takes h // factor, as ggml maps heads), bit for bit; repeated the other
    way (np.tile: head h takes h % heads) the GQA cases fail, so the relation sees it."""
    rows = parity.check(["op:flash_attn_ext", "op:mul_mat"], paths=["ggml", "repeated"], probe=False)
    assert {(r.a, r.b) for r in rows} == {("ggml", "repeated")}
    assert all(r.verdict == "skipped" or r.verdict == "ok" and r.nmse == 0.0 for r in rows)
    gqa = {r.case for r in rows if r.op == "flash_attn_ext"}
    assert "F32 GQA 4 q heads on 2, DV != DK" in gqa and "F32 2 heads, no mask" not in gqa   # nothing to repeat
    assert any(r.op == "mul_mat" for r in rows)
    monkeypatch.setattr(np, "repeat", lambda v, k, axis: np.tile(v, [k if i == axis else 1 for i in range(v.ndim)]))
    rows = parity.check("op:flash_attn_ext", paths=["ggml", "repeated"], types=["F32"], probe=False)
    assert "F32 GQA 4 q heads on 2, DV != DK" in {r.case for r in rows if r.verdict == "fail"}


def test_quantized_types_come_back_the_same_three_ways_or_the_table_says_why(monkeypatch):
    """quant:TYPE: ggml_quantize_chunk, a graph's F32 -> TYPE copy and a second quantization
    of the dequantized values, compared by value: exact for the plain types; IQ4_NL's copy
    skips the chunk quantizer's scale search (its rows fail without their entry)."""
    from pyggml.parity import runner
    names = {c.subject for c in runner.select()}
    assert {"quant:Q4_0", "quant:Q4_K", "quant:IQ4_NL"} <= names
    assert "quant:IQ1_S" not in names and "quant:Q8_1" not in names       # on request; no to_float
    assert "quant:IQ1_S" in {c.subject for c in runner.select(["quant:IQ1*"])}
    rows = parity.check(["quant:Q4_0", "quant:Q8_0", "quant:IQ4_NL", "quant:Q5_K"])
    assert {(r.a, r.b) for r in rows} == {("quantize", "cpy"), ("quantize", "requantize")}
    if not built_from_the_pin():
        return          # (QUANT_DIFFERS is measured on the pin's quantizers)
    assert all(r.verdict == "ok" for r in rows)
    exact = [r for r in rows if r.subject in ("quant:Q4_0", "quant:Q8_0")]
    assert len(exact) == 12 and all(r.nmse == 0.0 and r.tol == 0.0 for r in exact)
    assert any(r.subject == "quant:Q5_K" and r.b == "requantize" and r.nmse > 0 for r in rows)
    monkeypatch.delitem(relations.QUANT_DIFFERS, ("cpy", "IQ4_NL"))
    rows = parity.check("quant:IQ4_NL", paths=["quantize", "cpy"])
    assert [r.verdict for r in rows] == ["fail"] * 3


def test_a_graph_copy_to_iq4_nl_is_less_accurate_than_ggml_quantize_chunk():
    """The reason behind QUANT_DIFFERS' IQ4_NL entry, measured: the chunk quantizer's scale
    search gives a smaller error than the copy's single scale."""
    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    chunk = pyggml.dequantize(Type.IQ4_NL, pyggml.quantize(Type.IQ4_NL, x), x.shape)
    with pyggml.Context(64 << 20) as ctx:
        c = pyggml.cpy(ctx, ctx.from_numpy(x), ctx.new_tensor(Type.IQ4_NL, (512, 64)))
        g = pyggml.Graph(ctx)
        g.build_forward_expand(c)
        g.compute(1)
        copied = pyggml.dequantize(Type.IQ4_NL, np.array(c.blocks()), x.shape)
    err = [float(np.sum((y - x) ** 2) / np.sum(x ** 2)) for y in (chunk, copied)]
    assert err[0] < err[1] < 1.2 * err[0]


def test_on_more_threads_a_batch_is_its_items_within_the_threads_bound_where_the_batch_changes_the_split(
        monkeypatch):
    """On more than one thread, ggml splits flash_attn_ext's keys over the threads only where
    the query is one row of one item (ops.cpp: the split-KV path, neq1 == 1 and neq3 == 1):
    an item alone takes it, the batch of three does not, and the sums differ in order. The
    batch relation takes the threads relation's bound there and stays bit for bit on one
    thread. (Found by a sweep with --threads 2, scripts/bench_targets.py: on ggml 0.25.3 a
    fail row, max |diff| 2.8e-7; CI's sweeps run on one thread.)"""
    cases = [c for c in parity.select(["flash_attn_ext"], ["F32"], False, 0, False)
             if c.label == "F32 split-KV path: 512 keys"]
    assert len(cases) == 1
    paths = ["batched", "per-item"]
    one, = parity.check_case(cases[0], paths, probe=False, n_threads=1)[0]
    two, = parity.check_case(cases[0], paths, probe=False, n_threads=2)[0]
    assert one.verdict in FINE and one.tol == 0.0
    assert two.verdict in FINE and two.tol == relations.threads_tolerance("flash_attn_ext", "F32") == 1e-10
    # exact elsewhere, whatever the count: ops whose kernels give each element to one thread
    mm = next(c for c in parity.select(["mul_mat"], ["F32"], False, 0, False) if c.label.startswith("F32"))
    rows, _ = parity.check_case(mm, paths, probe=False, n_threads=2)
    assert rows and all(r.tol == 0.0 and r.verdict == "ok" for r in rows)
    if not built_from_the_pin() or two.verdict != "ok":
        return
    assert two.max_abs > 0          # the split is what differs: without the bound, a fail row
    monkeypatch.setattr(relations, "NOT_BITWISE_ACROSS_THREADS", {})
    again, = parity.check_case(cases[0], paths, probe=False, n_threads=2)[0]
    assert again.verdict == "fail" and again.tol == 0.0
