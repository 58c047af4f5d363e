"""Known upstream ggml defects: one record each, and a probe that measures it on the
linked ggml.

pyggml refuses an input that would hit a defect with :class:`pyggml.UpstreamDefect`
(whose ``.defect`` is the record's id), or works around it, and says which in
``action``. ``pyggml parity``, ``pyggml info`` and ``scripts/ci_upstream.py`` read this
registry; nothing else describes a defect.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Defect", "DEFECTS", "get", "known_defects", "probe_all", "release_key"]


def release_key(release: str | None) -> tuple[int, ...]:
    """"0.25.3" -> (0, 25, 3), for ordering releases: the first three numbers of the text
    ("0.25.3-dev" too); () for one without a number ("unknown", None). The one parser of a
    release: the build (pyggml/_gen_ops.py), the scripts and the tests all use it."""
    return tuple(int(x) for x in re.findall(r"\d+", release or "")[:3])


@dataclasses.dataclass(frozen=True)
class Defect:
    id: str
    title: str
    ops: tuple[str, ...]            # GGML_OP names (as ggml_op_name gives them)
    where: str                      # upstream code involved
    action: str                     # what pyggml does about it
    seen_in: tuple[str, ...]        # ggml releases where a probe or a test saw it
    probe: str = ""                 # the function of pyggml._defect_probes that measures it
    probe_unit: str = ""            # what the probe's number means
    # undefined behaviour in upstream code that pyggml runs as it is: the UBSan suppressions
    # ("check:function") that let a sanitized build (scripts/sanitize.py) run past it and no
    # further (anything else UBSan reports stays fatal)
    ubsan: tuple[str, ...] = ()
    # the tests that show it on the linked ggml where there is no probe: each runs ggml's own
    # code (rules off, or autodiff) and asserts the defect's symptom, so that a release in
    # seen_in is one where they passed
    shown_by: tuple[str, ...] = ()
    # the first release measured (by the probe, or the test that shows it) where it is gone,
    # after the releases in seen_in; "" while every release measured has it
    fixed_in: str = ""

    def run_probe(self):
        """The probe's measurement on the linked ggml (None: not applicable here)."""
        if not self.probe:
            return None
        from pyggml import _defect_probes
        from pyggml.errors import GGMLVersionError
        try:
            return getattr(_defect_probes, self.probe)()
        except GGMLVersionError:        # the op (or feature) the probe needs is not in this ggml
            return None

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("probe")
        return d


DEFECTS: tuple[Defect, ...] = (
    Defect(
        id="rope-ndims0-hang",
        title="ROPE with n_dims = 0 never returns (the rewritten tail copy steps backwards)",
        ops=("ROPE",),
        where="ggml-cpu/ops.cpp, the rope kernel's copy of the unrotated channels, as rewritten after 0.20.2: at "
              "i0 == the rotated block's offset it adds n_dims - 2 (= -2) and continues, so i0 cycles 0, -2, 0 "
              "forever; the builder accepts n_dims = 0 (0 is even and <= ne0)",
        action="refused with UpstreamDefect unless the ROPE kernel is known to be one of 0.20.2 or before "
               "(kernel trust, pg_kernel_before), whose copy of the row is allowed",
        seen_in=("0.25.3",),
        probe="rope_ndims0",
        probe_unit="kernel verdict, rules off, of rope(x[8], pos, n_dims=0, mode 0) with a 5 s limit "
                   "('ok': absent, 'hang': present)",
    ),
    Defect(
        id="fab-builder-aborts",
        title="ggml_flash_attn_back() aborts unconditionally",
        ops=("FLASH_ATTN_BACK",),
        where="ggml.c ggml_flash_attn_back: GGML_ABORT(\"TODO: adapt to ggml_flash_attn_ext() changes\") "
              "since commit 1a815669 (2024-05-23)",
        action="pyggml builds the node itself, as the builder did just before that commit "
               "(pyggml.flash_attn_back); the CPU kernel still runs",
        seen_in=("0.9.4", "0.13.1", "0.17.0", "0.20.2"),
    ),
    Defect(
        id="fab-batch-gqa-oob",
        title="FLASH_ATTN_BACK writes past its result with batch + GQA",
        ops=("FLASH_ATTN_BACK",),
        where="ggml-cpu/ops.cpp, FLASH_ATTN_BACK's F32 kernel: it steps grad_k and grad_v from one batch "
              "(ne3) to the next by q's head count, where k's and v's (kvne2) belong",
        action="refused with UpstreamDefect (ne3 > 1 and kvne2 < ne2); attention_backward computes "
               "each batch as its own node",
        seen_in=("0.9.4", "0.13.1", "0.17.0", "0.20.2", "0.25.3"),
        probe="fab_batch_gqa_oob",
        probe_unit="bytes written past the result (D=16, N=M=6, ne2=4, kvne2=2, ne3=2; 0: fixed)",
    ),
    Defect(
        id="add1-grad-mean",
        title="the backward pass of ggml_add1 gives the scalar the mean of the gradient, not its sum",
        ops=("ADD1",),
        where="ggml.c ggml_compute_backward, case GGML_OP_ADD1: ggml_mean(ctx, grad) "
              "(\"TODO: should probably be sum instead of mean\")",
        action="build_backward_expand refuses a graph where an ADD1's b needs a gradient (UpstreamDefect); "
               "the gradient check of pyggml.opinfo shows the factor",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_autodiff.py::test_upstream_add1_gradient_is_the_mean_where_the_sum_belongs",),
    ),
    Defect(
        id="sub-div-broadcast-grad",
        title="the backward pass of ggml_sub and ggml_div aborts when b is broadcast",
        ops=("SUB", "DIV"),
        where="ggml.c ggml_compute_backward, cases GGML_OP_SUB/GGML_OP_DIV: the gradient of b is not reduced "
              "with ggml_repeat_back (ADD and MUL do it), then GGML_ASSERT(ggml_are_same_shape(src1, grad))",
        action="build_backward_expand refuses the graph with UpstreamDefect before ggml would abort",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_autodiff.py::test_upstream_sub_div_gradient_of_a_broadcast_b_aborts",),
    ),
    Defect(
        id="add1-quantized-batch",
        title="ggml_add1 of a quantized tensor with ne3 > 1 writes the batches over each other",
        ops=("ADD1",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_add1_q_f32: dst_row at i1*nb1 + i2*nb2 + i3*nb0 "
              "(nb0 where nb3 belongs)",
        action="refused with UpstreamDefect for a quantized src0 with ne3 > 1 (tests/test_rules_arith.py shows "
               "the wrong values with the rule off)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_arith.py::test_add1_of_a_quantized_batch_is_refused_and_really_wrong",),
    ),
    Defect(
        id="acc-bounds-check",
        title="ggml_acc's bound check lets the last element end past the result",
        ops=("ACC",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_acc_f32: GGML_ASSERT(offset + ... < ggml_nbytes(dst)) "
              "checks where the last float starts, not where it ends",
        action="refused with UpstreamDefect when the last element would end past the result (a write of up "
               "to 3 bytes past it, which pyggml's guarded proof catches); reachable only with an offset that "
               "is not a multiple of 4, for aligned offsets the check is exact",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_arith.py::test_acc_past_the_end_is_refused_and_really_out_of_bounds",),
    ),
    Defect(
        id="count-equal-row-index",
        title="COUNT_EQUAL counts the wrong rows of 3-D and 4-D tensors, and can read outside them",
        ops=("COUNT_EQUAL",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_count_equal_i32: i02 = (ir - i03*ne03)/ne01 and "
              "i01 = ir - i03*ne03 - i02*ne02, where i03*ne02*ne01 and i02*ne01 belong",
        action="refused with UpstreamDefect unless (ne03 == 1 or ne03 == ne01*ne02) and (ne02 == 1 or "
               "ne02 == ne01), the shapes where the index is right (checked exhaustively); reshape to 2-D",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_reduce.py::test_count_equal_row_index_defect_counts_wrong_rows",),
    ),
    Defect(
        id="mean-grad-accumulate",
        title="the backward pass of ggml_mean aborts when its input also has another gradient",
        ops=("MEAN",),
        where="ggml.c ggml_compute_backward, case GGML_OP_MEAN: ggml_add1_or_set with a [1, ne1, ne2, ne3] "
              "gradient; when src0 already has one, ggml_add1_impl asserts ggml_is_scalar(b)",
        action="build_backward_expand refuses such a graph with UpstreamDefect before ggml would abort",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_autodiff.py::test_upstream_mean_gradient_with_another_gradient_aborts",),
    ),
    Defect(
        id="rope-odd-ne0",
        title="ROPE (and ROPE_BACK) with an odd ne0 copies one element past each row",
        ops=("ROPE", "ROPE_BACK"),
        where="ggml-cpu/ops.cpp rope_flt: the tail copy steps i0 += 2 and copies [i0 + 1]; in VISION mode the "
              "extra pair (n_dims, 2*n_dims) rotates element n_dims twice",
        action="refused with UpstreamDefect (out of bounds on the last row; a race on the next row with threads)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_attention.py::test_rope_odd_ne0_runs_past_the_rows",
                  "tests/test_rules_attention.py::test_rope_odd_ne0_inside_a_tensor_turns_the_wrong_elements"),
    ),
    Defect(
        id="rope-freq-factors-oob",
        title="ROPE reads its frequency factors c past their end",
        ops=("ROPE",),
        where="ggml-cpu/ops.cpp ggml_rope_cache_init / ggml_mrope_cache_init read c[i0/2] for every i0 < ne0; "
              "the builder asserts only c.ne0 >= n_dims/2",
        action="refused with UpstreamDefect when c.ne0 < ne0/2 (pyggml's guarded proof sees the read)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_attention.py::test_rope_freq_factors_past_n_dims",),
    ),
    Defect(
        id="rope-vision-section-reset",
        title="ROPE in VISION mode does not restart a section that follows an empty one",
        ops=("ROPE",),
        where="ggml-cpu/ops.cpp ggml_mrope_cache_init: the else-if chain that resets theta per section",
        action="refused with UpstreamDefect when replaying the chain shows the wrong angle (sections (2,0,2,0): "
               "NMSE 0.55 against the reference)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_attention.py::test_rope_vision_section_after_an_empty_one",),
    ),
    Defect(
        id="get-rel-pos-bf16",
        title="GET_REL_POS of a BF16 tensor reads BF16 bits as F16",
        ops=("GET_REL_POS",),
        where="ggml.c ggml_get_rel_pos makes an F16 result whatever a's type; the CPU kernel copies the bits",
        action="refused with UpstreamDefect for a BF16 a",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_attention.py::test_get_rel_pos_bf16_result_holds_bf16_bits",),
    ),
    Defect(
        id="add-rel-pos-ne3",
        title="ADD_REL_POS adds to the first slice only when a.ne3 > 1",
        ops=("ADD_REL_POS",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_add_rel_pos_f32 loops over pw->ne[3] == a->ne[2] only",
        action="refused with UpstreamDefect for a.ne3 > 1 (the other slices would be copied unchanged)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_attention.py::test_add_rel_pos_ignores_a_ne3",),
    ),
    Defect(
        id="soft-max-alibi-grad",
        title="the backward pass of soft_max_ext with ALiBi (max_bias > 0) aborts at compute",
        ops=("SOFT_MAX", "SOFT_MAX_BACK"),
        where="ggml.c ggml_compute_backward passes max_bias to ggml_soft_max_ext_back, whose CPU kernel asserts "
              "max_bias == 0 (ggml-cpu/ops.cpp ggml_compute_forward_soft_max_ext_back_f32)",
        action="build_backward_expand refuses such a graph with UpstreamDefect",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_autodiff.py::test_upstream_soft_max_alibi_gradient_aborts_at_compute",),
    ),
    Defect(
        id="wkv7-simd-tail-oob",
        title="RWKV_WKV7 reads and writes past each head when the head size is not a multiple of the SIMD step",
        ops=("RWKV_WKV7",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_rwkv_wkv7_f32, GGML_SIMD branch: "
              "for (; j < head_size; j += GGML_F32_STEP) with no tail (\"There shouldn't be left-overs\")",
        action="refused with UpstreamDefect where head_size % step != 0 (the step of this CPU's build)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_recurrent.py::test_wkv7_head_size_and_the_simd_step",),
    ),
    Defect(
        id="wkv-tokens-per-seq-oob",
        title="RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7 write past their result when n_tokens is not a "
              "multiple of n_seqs",
        ops=("RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7"),
        where="ggml-cpu/ops.cpp: state_offset = head_size*C*(t / (T/n_seqs)); the builders never assert T % n_seqs",
        action="refused with UpstreamDefect (fewer tokens than sequences divides by zero: refused too)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_recurrent.py::test_wkv_ops_need_whole_sequences",),
    ),
    Defect(
        id="recurrent-zero-tokens-state",
        title="with 0 tokens, the state part of a recurrent op's result is never written",
        ops=("RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7", "SSM_SCAN"),
        where="ggml-cpu/ops.cpp: the token loop is the kernels' only writer of the states",
        action="refused with UpstreamDefect (the result would hold stale memory where the input state belongs)",
        seen_in=("0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_recurrent.py::test_wkv_ops_with_no_tokens_are_an_upstream_defect",
                  "tests/test_rules_recurrent.py::test_ssm_scan_with_no_tokens_is_an_upstream_defect"),
    ),
    Defect(
        id="gelu-quick-f32-table-overflow",
        title="F32 GELU_QUICK and GEGLU_QUICK give inf or NaN for |x| > 65504",
        ops=("UNARY", "GLU"),
        where="ggml-cpu/vec.h ggml_vec_gelu_quick_f32 / ggml_vec_geglu_quick_f32 round x to F16 and read the F16 "
              "table without the clamp ggml_vec_gelu_f32 has",
        action="not refused (it depends on values): pyggml.opinfo's samples stay in range; "
               "tests/test_rules_activation.py shows it",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_activation.py::test_gelu_quick_f32_table_overflows_past_f16_range",),
    ),
    Defect(
        id="expm1-cancellation",
        title="EXPM1 loses all precision near 0 (expf(x) - 1, not expm1f)",
        ops=("UNARY",),
        where="ggml-cpu/unary-ops.cpp op_expm1",
        action="not refused (it depends on values): 19% off at |x| = 1e-7, 0 below 3e-8; shown by a test",
        seen_in=("0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_math.py::test_expm1_loses_relative_precision_near_zero",),
    ),
    Defect(
        id="softplus-underflow",
        title="SOFTPLUS is 0 for x <= -17 (logf(1 + expf(x)), not log1pf)",
        ops=("UNARY",),
        where="ggml-cpu/unary-ops.cpp op_softplus",
        action="not refused (it depends on values): shown by a test",
        seen_in=("0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_math.py::test_softplus_underflows_for_negative_inputs",),
    ),
    Defect(
        id="wkv-threads-over-heads",
        title="RWKV_WKV6 and GATED_LINEAR_ATTN hang, RWKV_WKV7 computes wrong values, on more threads than heads",
        ops=("RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7"),
        where="ggml-cpu/ops.cpp, the three kernels of libggml-python 0.9.4's wheel: they split the heads over the "
              "threads; with more threads than heads, WKV6 and GLA never return (every thread waits in libgomp's "
              "team barrier) and WKV7's results change with the thread count (NMSE 1.0 and 2e43 against float64 "
              "on 1 head, 0.49 on 2 heads with 3 threads); 0.20.2's and 0.25.3's compute every count alike",
        action="refused with UpstreamDefect at compute (Graph.compute, a CPU backend, a scheduler) where the "
               "thread count exceeds a node's heads on a ggml whose probe shows it; found by the sweep's threads "
               "relation",
        seen_in=("0.9.4",),
        probe="wkv_threads_over_heads",
        probe_unit="'wrong': RWKV_WKV7 on 1 head differs between 1 and 3 threads; 'ok': the same bits",
    ),
    Defect(
        id="unary-nan-dropped",
        title="RELU, LEAKY_RELU, SGN, STEP and HARDSIGMOID turn NaN into a number",
        ops=("UNARY", "LEAKY_RELU"),
        where="ggml-cpu/unary-ops.cpp op_relu, op_sgn, op_step, op_hardsigmoid and ggml-cpu/vec.h "
              "ggml_vec_leaky_relu_f32: (x > 0.f) ? x : 0.f and fminf/fmaxf clamps are false or pick the "
              "number for NaN",
        action="not refused (it depends on values): a NaN that reaches these ops becomes 0 and leaves no "
               "trace in the result (numpy and torch keep NaN); "
               "pyggml parity ulp counts it (NaN-)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_ulp.py::test_relu_sgn_step_hardsigmoid_and_leaky_relu_turn_nan_into_a_number",),
    ),
    Defect(
        id="fattn-f16-v-accumulator",
        title="FLASH_ATTN_EXT with an F16 V accumulates in F16 even with GGML_PREC_F32",
        ops=("FLASH_ATTN_EXT",),
        where="ggml-cpu/ops.cpp flash_attn_ext with F16 V (fewer than 64 rows, or the split-KV path)",
        action="not refused (precision): NMSE ~1e-5 at 500 keys against 5e-8 with an F32 V; "
               "tests/test_rules_attention.py bounds it",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_attention.py::test_fa_split_kv_f16_accumulates_in_f16",),
    ),
    Defect(
        id="set-bounds-off-by-one",
        title="ggml_set's bound check lets the last element of b end past a",
        ops=("SET",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_set_f32/_i32: GGML_ASSERT(offset + sum (ne_i-1)*nb_i <= "
              "nbytes) checks where the last element starts (ACC uses <)",
        action="refused with UpstreamDefect when b's last element would end past a (tests/test_rules_layout.py)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        probe="set_bounds",
        probe_unit="kernel verdict, rules off, of set_1d(a[1024], b[1], offset 4096) ('ok': fixed)",
    ),
    Defect(
        id="pad-circular-left-oob",
        title="circular PAD with a left pad longer than the extent reads before src0",
        ops=("PAD",),
        where="ggml-cpu/ops.cpp ggml_wrap_around: (i - lp + ne) % ne is negative for i < lp - ne",
        action="refused with UpstreamDefect when a left pad exceeds its extent (right pads wrap correctly)",
        seen_in=("0.17.0", "0.20.2", "0.25.3"),
        probe="pad_circular",
        probe_unit="kernel verdict, rules off, of pad_ext_circular of a 32x32 tensor by (64, 1) ('ok': fixed)",
    ),
    Defect(
        id="cpy-quantized-reshape-oob",
        title="a same-type quantized copy from a strided source into a reshaped result writes past it",
        ops=("DUP", "CONT", "CPY"),
        where="ggml-cpu/ops.cpp ggml_compute_forward_dup_bytes, 'dst contiguous' branch: ne00 * type_size bytes "
              "per row, counting elements as blocks",
        action="refused with UpstreamDefect (tests/test_rules_layout.py shows the out-of-bounds write)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_layout.py::test_dup_bytes_quantized_reshape_overruns",),
    ),
    Defect(
        id="add-q-no-from-float",
        title="ADD and ADD1 of a quantized tensor into a type the CPU cannot write (the grid IQ types) write "
              "past each row or call NULL",
        ops=("ADD", "ADD1"),
        where="ggml-cpu/ops.cpp ggml_compute_forward_add_q_f32: without a CPU from_float for dst's type it "
              "memcpy's ne0*nb0 bytes of F32 sums into each row, nb0 being a block's size; "
              "ggml_compute_forward_add1_q_f32 calls the type's from_float unchecked. Both switches list "
              "IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M, IQ3_S and IQ2_S, which have none",
        action="refused with UpstreamDefect where the result is such a type (into F32, ADD is right); "
               "tests/test_rules_arith.py shows the write past the result and the abort, rules off; "
               "docs/upstream-defect-add-q-no-from-float.md is the write-up",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        probe="add_q_no_from_float",
        probe_unit="kernel verdict, rules off, of add1(iq2_xxs[256] zeroed, f32[1]) ('ok': fixed)",
    ),
    Defect(
        id="q1-0-dot-misaligned-load",
        title="Q1_0's x86 dot product reads a uint32 from a 2-byte-aligned block (undefined in C)",
        ops=("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT"),
        where="ggml-cpu/arch/x86/quants.c ggml_vec_dot_q1_0_q8_0: qs32 = (const uint32_t *) x[ib].qs, and "
              "block_q1_0 (an F16 scale and 16 bytes) is 2-byte aligned",
        action="not refused: x86-64 loads unaligned words, and the products are right (mul_mat's samples against "
               "float64); UBSan reports it, so a sanitized build suppresses this one site",
        seen_in=("0.20.2",),
        ubsan=("alignment:ggml_vec_dot_q1_0_q8_0",),
    ),
    Defect(
        id="iq3-s-dot-sign-shift",
        title="IQ3_S's x86 dot product shifts a uint16 into an int's sign bit (undefined in C)",
        ops=("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT"),
        where="ggml-cpu/arch/x86/quants.c ggml_vec_dot_iq3_s_q8_K: signs[0] | (signs[1] << 16), signs a "
              "const uint16_t * (promoted to int, so a set top bit shifts into the sign)",
        action="not refused: GCC and Clang give the two's complement bits, and the products are right "
               "(mul_mat's samples against float64); a sanitized build suppresses this one site",
        seen_in=("0.20.2",),
        ubsan=("shift-base:ggml_vec_dot_iq3_s_q8_K",),
    ),
    Defect(
        id="iq1-s-dot-misaligned-load",
        title="IQ1_S's x86 dot product reads a uint32 at a 2-byte-aligned offset (undefined in C)",
        ops=("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT"),
        where="ggml-cpu/arch/x86/quants.c ggml_vec_dot_iq1_s_q8_K: *(const uint32_t *)qs inside block_iq1_s "
              "(2-byte aligned)",
        action="not refused: x86-64 loads unaligned words; a sanitized build suppresses this one site "
               "(IQ1_S needs an imatrix and seconds of setup: sampled by tests/test_opinfo.py's slow-type test)",
        seen_in=("0.20.2",),
        ubsan=("alignment:ggml_vec_dot_iq1_s_q8_K",),
    ),
    Defect(
        id="tiled-iq3-xxs-misaligned-load",
        title="0.25.3's tiled K-quant MUL_MAT reads IQ3_XXS scales and signs as a uint32 at a 2-byte-aligned offset "
              "(undefined in C)",
        ops=("MUL_MAT", "MUL_MAT_ID"),
        where="ggml-cpu/tiled/tiled.cpp tiled_unpack_src0 (block_iq3_xxs): *(const uint32_t *) (x.qs + QK_K/4 + "
              "4*ib32) inside a 98-byte block (2-byte aligned); the tiled path runs from 8 src1 rows on",
        action="not refused: x86-64 loads unaligned words; a sanitized build suppresses this one site (UBSan "
               "halted the sanitizer stage on mul_mat's IQ3_XXS sample of 36 src1 rows)",
        seen_in=("0.25.3",),
        ubsan=("alignment:tiled_unpack_src0",),
    ),
    Defect(
        id="gguf-reader-enum-load",
        title="ggml's GGUF reader reads a file's type fields into enum variables before checking them "
              "(undefined in C++ for a value outside the enum)",
        ops=(),
        where="gguf.cpp gguf_init_from_reader: gr.read(type) into an enum gguf_type (a key's value type) and "
              "into the tensor info's enum ggml_type, then the range check; UBSan: 'load of value 167, which is "
              "not a valid value for type gguf_type' on a mutated file",
        action="not refused: the reader then refuses the file (GGUFError; tests/test_gguf.py, whose mutated "
               "files reach it); a sanitized build suppresses this one check in this one function",
        seen_in=("0.25.3",),
        ubsan=("enum:gguf_init_from_reader",),
    ),
    Defect(
        id="cpy-f16-i32-work",
        title="F16/BF16 -> I32 copies use a work buffer ggml_graph_plan does not reserve",
        ops=("CPY",),
        where="ggml-cpu/ops.cpp dup_to_q with I32's from_float goes through an F32 row in wdata; "
              "ggml-cpu.c ggml_graph_plan reserves it only for quantized results, F16 <-> BF16 and F32 <-> I32",
        action="refused with UpstreamDefect (the kernel is right when another node asks for a work buffer: "
               "tests/test_rules_layout.py)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_layout.py::test_cpy_f16_to_i32_lacks_its_work_buffer",),
    ),
    Defect(
        id="cpy-to-q-work-size",
        title="a copy into a quantized result with longer source rows overruns the work buffer",
        ops=("CPY",),
        where="ggml-cpu/ops.cpp dup_to_q uses ne00 + 16 floats per thread; ggml_graph_plan sizes the buffer "
              "from the result's ne0",
        action="refused with UpstreamDefect when src0's rows are longer than the result's",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        probe="cpy_to_q_work",
        probe_unit="kernel verdict, rules off, of cpy(f32[512], q8_0[32, 16]) ('ok': fixed)",
    ),
    Defect(
        id="view-grad-overlap",
        title="the backward pass of views (and SET's b) is wrong when the strides reach elements twice",
        ops=("VIEW", "SET"),
        where="ggml.c ggml_compute_backward, cases GGML_OP_VIEW (ggml_acc_or_set: ACC writes src0 + b row by row, "
              "overwriting where it should add) and GGML_OP_SET (b gets the gradient of elements it overwrote)",
        action="build_backward_expand refuses the graph with UpstreamDefect (csrc/backward.c)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_layout.py::test_view_gradient_with_overlapping_rows_is_refused",),
    ),
    Defect(
        id="get-rows-back-strided-index",
        title="GET_ROWS_BACK reads its indices as a packed array; GET_ROWS honours their strides",
        ops=("GET_ROWS_BACK", "GET_ROWS"),
        where="ggml-cpu/ops.cpp ggml_compute_forward_get_rows_back_f32: ((int32_t *) src1->data)[i]; "
              "ggml.c ggml_compute_backward passes GET_ROWS's indices as they are",
        action="refused with UpstreamDefect (a strided index vector: the gradient of other rows, or a read "
               "past the indices)",
        seen_in=("0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_layout.py::test_get_rows_gradient_with_a_strided_index_vector_is_refused",
                  "tests/test_rules_backward.py::test_get_rows_back_reads_its_indices_as_an_array"),
    ),
    Defect(
        id="pool-2d-back-f16-oob",
        title="POOL_2D_BACK reads an F16 forward input as F32",
        ops=("POOL_2D_BACK",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_pool_2d_back reads src1 as dst->type (always F32); "
              "ggml_pool_2d accepts F16 input",
        action="refused with UpstreamDefect (autodiff of pool_2d on F16 input reads past it)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_backward.py::test_rule_refuses_what_the_kernel_fails_on",),
    ),
    Defect(
        id="mul-mat-broadcast-grad",
        title="the backward pass of a broadcast mul_mat aborts when b has ne[3] > 1",
        ops=("MUL_MAT",),
        where="ggml.c ggml_compute_backward, case GGML_OP_MUL_MAT: GGML_ASSERT(tmp->ne[3] == 1) before summing "
              "a's gradient over the broadcast",
        action="build_backward_expand refuses the graph with UpstreamDefect before ggml would abort",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_matmul.py::test_upstream_mul_mat_backward_aborts_for_a_broadcast_a_and_a_4d_b",),
    ),
    Defect(
        id="backward-strided-grad",
        title="the backward pass hands transposed or permuted gradients to kernels that need packed rows",
        ops=("SILU_BACK", "SOFT_MAX_BACK", "RMS_NORM_BACK", "REPEAT_BACK"),
        where="ggml.c ggml_compute_backward passes ggml_transpose/ggml_permute views of the gradient on; "
              "SILU_BACK then computes wrong values, the others abort",
        action="the *_BACK kernel rules (csrc/rules_backward.c) refuse such nodes in build_backward_expand "
               "with KernelPreconditionError",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_backward.py::test_upstream_autodiff_hands_row_kernels_a_transposed_gradient",),
    ),
    Defect(
        id="cross-entropy-grad-label-sum",
        title="CROSS_ENTROPY_LOSS_BACK is the gradient only for label rows that sum to 1",
        ops=("CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK"),
        where="ggml-cpu/ops.cpp ggml_compute_forward_cross_entropy_loss_back: (softmax(a) - b) / rows drops the "
              "softmax term's factor sum(b)",
        action="documented only: the labels are data (NMSE 0.94 for U(0,1) labels; tests/test_rules_train.py)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_train.py::test_upstream_cross_entropy_gradient_assumes_labels_sum_to_one",),
    ),
    Defect(
        id="conv-transpose-2d-batch",
        title="CONV_TRANSPOSE_2D computes the first batch only",
        ops=("CONV_TRANSPOSE_2D",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_conv_transpose_2d_impl never loops over ne13: with "
              "b.ne[3] > 1 every batch after the first stays zero (upstream ggml-org/ggml issue #1448)",
        action="refused with UpstreamDefect when b.ne[3] > 1 (tests/test_rules_conv.py shows the zeros); "
               "ggml 0.25.3's rewritten kernel computes every batch (its probe), and its reviewed rule takes "
               "batches there (pyggml/kernels.txt); a changed kernel not reviewed still refuses them",
        seen_in=("0.9.4", "0.17.0", "0.20.2"),
        fixed_in="0.25.3",
        probe="conv_transpose_2d_batch",
        probe_unit="kernel verdict, rules off, on batch 1 of a 2-batch result of equal batches ('ok': computed "
                   "as batch 0, absent; 'zeros': present)",
    ),
    Defect(
        id="upscale-nearest-index-rounding",
        title="UPSCALE picks the wrong source pixel where i/sf rounds down in float32",
        ops=("UPSCALE",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_upscale_f32: the nearest index is (int)(i0/sf0) with sf0 "
              "a float32 ratio (resizing 14 -> 2 picks pixel 6 for 7); dims 2 and 3 in every mode, dims 0 and 1 "
              "in NEAREST",
        action="refused with UpstreamDefect for the sizes where the float32 index differs from the exact one "
               "(found in bounded time: rules_conv.c); conservatively also for an axis past 2**23 positions "
               "that pyggml cannot settle in bounded time (the refusal says so)",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_conv.py::test_upscale_nearest_index_rounding_is_an_upstream_defect",),
    ),
    Defect(
        id="upscale-antialias-align-corners",
        title="bilinear UPSCALE with ANTIALIAS and ALIGN_CORNERS drops a tap",
        ops=("UPSCALE",),
        where="ggml-cpu/ops.cpp ggml_compute_forward_upscale_f32: the window end is cut at (int64)(x + support) "
              "with pixel offset 0, which drops a tap of positive weight ([0, 1] -> 3 gives [0, 0, 1])",
        action="refused with UpstreamDefect where a tap is dropped; conservatively also for an axis past "
               "2**17 positions its bounded probes do not settle (the refusal says so)",
        seen_in=("0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_conv.py::test_upscale_antialias_with_aligned_corners_is_an_upstream_defect",),
    ),
    Defect(
        id="pool-2d-fractional-padding",
        title="POOL_2D sizes its result with a fractional padding the kernel truncates",
        ops=("POOL_2D",),
        where="ggml.c ggml_pool_2d computes the result size with the float padding and stores it as int32 "
              "for the kernel (p0 = 0.5 on 4 columns: an extra window hanging off the end)",
        action="refused with UpstreamDefect for a padding that is not a whole number",
        seen_in=("0.9.4", "0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_conv.py::test_pool_2d_fractional_padding_is_an_upstream_defect",),
    ),
    Defect(
        id="conv-1d-batch-layout",
        title="ggml_conv_1d scrambles a batch",
        ops=("MUL_MAT", "RESHAPE"),
        where="ggml.c ggml_conv_1d reshapes mul_mat's [OL, N, OC] product to [OL, OC, N] without permuting it "
              "(upstream ggml-org/llama.cpp PR #28738, open)",
        action="conv_1d and conv_1d_ph refuse b.ne[2] > 1 with UpstreamDefect before the builder runs "
               "(pyggml/_prechecks.py; tests/test_rules_conv.py shows the scramble)",
        seen_in=("0.17.0", "0.20.2", "0.25.3"),
        shown_by=("tests/test_rules_conv.py::test_conv_1d_with_a_batch_is_refused_and_really_scrambled",),
    ),
    Defect(
        id="conv-2d-dw-f32-kernel",
        title="ggml_conv_2d_dw with an F32 kernel builds a mul_mat the CPU cannot run",
        ops=("MUL_MAT",),
        where="ggml.c ggml_conv_2d_dw puts an F32 kernel as mul_mat's src0 with F16 im2col columns as src1; "
              "the CPU mul_mat takes src1 in src0's dot-product type or F32 only",
        action="the MUL_MAT rule refuses the node (GGMLTypeError); use an F16 kernel. The refusal stands for "
               "the pinned mul_mat's abort (csrc pg_kernel_aborts): where MUL_MAT's kernel changed, the proof "
               "decides, and ggml 0.25.3's mul_mat converts the columns (its probe; tests/test_rules_conv.py "
               "checks its values)",
        seen_in=("0.20.2",),
        fixed_in="0.25.3",
        probe="conv_2d_dw_f32_kernel",
        probe_unit="kernel verdict, rules off, of conv_2d_dw with an F32 kernel ('abort': present; 'ok': absent)",
    ),
    Defect(
        id="rope-offset-grad",
        title="the backward pass of a ROPE with an offset (ggml_rope_set_offset) rotates the wrong elements",
        ops=("ROPE",),
        where="ggml.c ggml_compute_backward, case GGML_OP_ROPE: ggml_rope_ext_back / ggml_rope_multi_back get "
              "the forward's n_dims, mode and frequencies from its op_params, but not n_offs (op_params[15]), "
              "so the ROPE_BACK rotates the gradient's first n_dims elements of each row instead of the block "
              "at the offset",
        action="build_backward_expand refuses a graph that needs the gradient through such a ROPE with "
               "UpstreamDefect",
        seen_in=("0.25.3",),
        probe="rope_offset_grad",
        probe_unit="max abs error of the input gradient of sum(rope(x, 4 dims at offset 2) * w) (0: absent)",
    ),
    Defect(
        id="mul-mat-tiled-q8k-batches",
        title="MUL_MAT and MUL_MAT_ID read the wrong rows of a Q8_K src1 whose batches are not packed",
        ops=("MUL_MAT", "MUL_MAT_ID"),
        where="ggml-cpu/tiled/tiled.cpp (new in 0.25.3), taken on x86 AVX builds for K-quant and IQ src0 from "
              "8 src1 rows on: ggml_compute_forward_mul_mat_tiled_one_chunk finds row r of src1's dims 1..3 at "
              "r*nb[1] (mul_mat_id_tiled_one_expert: token i12 at i12*ne11*nb11) where src1 is already Q8_K, "
              "ignoring nb[2] and nb[3]; ggml_tiled_supported's check for that case (Q8_K and not contiguous) is "
              "never reached, its type switch returns first. GGML_CPU_TILED_MM=0 takes the stock path, which is "
              "right",
        action="refused with UpstreamDefect where the reviewed 0.25.3 MUL_MAT/MUL_MAT_ID kernel would take the "
               "tiled path (csrc/rules_matmul.c); the wrong values are shown in tests/test_rules_matmul.py",
        seen_in=("0.25.3",),
        probe="mul_mat_tiled_q8k_batches",
        probe_unit="relative max error of mul_mat(Q4_K, Q8_K view with a gap after each batch of 8 rows), "
                   "rules off, against float64 (0: absent)",
    ),
    Defect(
        id="kernel-out-of-bounds",
        title="a CPU kernel reads or writes past one of its tensors on a node its builder accepted",
        ops=(),
        where="found at run time by pyggml's guarded proof (csrc/guarded.c): every tensor between guard pages",
        action="the graph is refused with UpstreamDefect (defect 'kernel-out-of-bounds'), naming the tensor; "
               "ops with a kernel rule (csrc/rules_*.c) are refused before they are built",
        seen_in=(),
    ),
    Defect(
        id="fab-work-size",
        title="ggml_graph_plan under-sizes FLASH_ATTN_BACK's work buffer for tiny heads",
        ops=("FLASH_ATTN_BACK",),
        where="ggml-cpu.c ggml_graph_plan reserves 4*max(D, Mup)*n_tasks floats; the kernel gives thread "
              "ith the floats from ith*2*(max(D, Mup) + CACHE_LINE_SIZE_F32)",
        action="pyggml allocates the work buffer itself, sized for the kernel (Graph.work_size)",
        seen_in=("0.9.4", "0.13.1", "0.17.0", "0.20.2", "0.25.3"),
        probe="fab_work_size",
        probe_unit="bytes the kernel uses past the plan's buffer (D=M=1, 4 threads; 0: fixed)",
    ),
)

_BY_ID = {d.id: d for d in DEFECTS}



def get(defect_id: str) -> Defect:
    """The record of ``defect_id`` (KeyError if there is none)."""
    return _BY_ID[defect_id]


def known_defects() -> list[dict]:
    """known_defects() -> list of dict: every known upstream defect (id, title, ops, where,
    action, seen_in, fixed_in, probe_unit, ubsan), as recorded in :mod:`pyggml.defects`."""
    return [d.as_dict() for d in DEFECTS]


def present(defect_id: str) -> bool | None:
    """Whether the linked ggml has the defect, as its probe measures it (once per
    process): True or False, None where it has no probe or the probe cannot run here."""
    if defect_id not in _PRESENT:
        # None while it is measured: a check the probe's own computation passes through
        # (Graph._check_threads) finds it not known to be present
        _PRESENT[defect_id] = None
        try:
            if defect_id == "fab-batch-gqa-oob":      # measured at import by pyggml._fab
                from pyggml import _fab
                v = _fab.FAB_BATCH_GQA_OVERRUN
            else:
                v = get(defect_id).run_probe()
        except BaseException:
            del _PRESENT[defect_id]
            raise
        _PRESENT[defect_id] = measures_defect(v)
    return _PRESENT[defect_id]


def measures_defect(measurement: object) -> bool | None:
    """Whether a probe's measurement shows the defect: probes measure bytes past a
    buffer (0: fixed) or a kernel verdict ('ok': fixed); None: no measurement."""
    if measurement is None:
        return None
    if isinstance(measurement, str):
        return measurement != "ok"
    return bool(measurement)


_PRESENT: dict[str, bool | None] = {}


def probe_all() -> dict[str, object]:
    """Run every defect's probe on the linked ggml: ``{id: measurement}`` (None where a
    defect has no probe or does not apply)."""
    return {d.id: d.run_probe() for d in DEFECTS}
