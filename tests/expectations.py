"""What the suite is known to fail on a ggml release other than the pinned one, and why.

Each entry is a finding about that release, measured there (``python
scripts/ci_upstream.py --ggml SPEC``, the spec's log): a test of a kernel rule written
against another release's kernel (the pinned ggml 0.25.3's, or 0.20.2's, the pin before). conftest.py marks the
tests an entry names ``xfail(strict=True)`` when that release is linked, so the suite's
verdict there reads "nothing else changed": a new failure fails the run, and so does an
entry that stops failing (a rule reviewed, a kernel changed back), as XPASS(strict),
until it is taken out. A key is a test's node id, without its parameters (every
parameter of it) or with them (that one).

ggml 0.25.3 (``sdist:llama-cpp-python==0.3.36``), 2026-12-03: 28 tests failed before
this list, 12 of them for causes the tests now handle (a builder that refuses an
oversized result itself, conv-transpose-2d-batch fixed, ROPE's overrun tests on a
kernel that spins instead). 15 were **false refusals** of one kind: pyggml's 0.20.2
rule refused a type its 0.20.2 kernel aborts on (GLU and GELU & co on BF16,
MUL_MAT on conv_2d_dw's F16 columns of an F32 kernel), which the changed 0.25.3 kernel
computes. Such a refusal now stands for the old kernel's abort (csrc pg_kernel_aborts):
where the kernel changed, the forked proof decides instead, and the tests check the
values the new kernel computes against float64. The 16th was not a refusal at fault:
CONCAT of a Q8_0 view of 1.5 blocks per row is refused at the view (no tensor ggml can
size), and only the test's check of the old kernel's abort failed; it now checks that
where CONCAT's kernel is 0.20.2's. Nothing is left to expect on 0.25.3, which is the pin
since 2026-12-03 (0.20.2 runs as ``sdist:libggml-python==0.20.2.post1``).

A test the linked release refuses itself (a feature it lacks; an abort pyggml caught on a ggml
its rules do not cover) is skipped, not listed here: conftest.py's ``pytest_runtest_call``.
"""

# {ggml version: {test node id (with or without its parameters): why it fails there}}
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    # ggml 0.9.4 (``pypi:libggml-python==0.9.4``, a prebuilt ggml: no kernel fingerprinted, every
    # graph proven), 2026-12-03: 639 tests failed before this list, none crashed or hung. Most were
    # that release refusing a sample itself, which the suite now skips, saying why (conftest.py,
    # harness.release_abort; 582 tests there, CI of 2026-12-03): builder asserts (unary ops on rows that are not
    # contiguous, SET_ROWS of a non-F32 source, FLASH_ATTN_EXT's mask padded to GGML_KQ_MASK_PAD),
    # kernel asserts the proof caught (F16-only im2col/conv kernels, POOL_1D with padding, norms
    # of strided rows), and features it lacks (ops, ggml_cplan.use_ref, GGML_TENSOR_FLAG_COMPUTE).
    # 14 were IMROPE samples computed as MROPE, silently: pyggml now refuses mode 40 where ggml.h
    # lacks it (GGMLVersionError). These 53 tests remain, each a finding about 0.9.4:
    "0.9.4": {
        "tests/test_opinfo.py::test_op_matches_reference[top_k-*":
            "ggml_top_k is ARGSORT + VIEW there (no GGML_OP_TOP_K): the result's op is VIEW, not the "
            "table's TOP_K (its index sets are right: 29 of 29, the order ggml leaves unspecified aside)",
        "tests/test_opinfo.py::test_op_matches_reference[conv_2d_dw_direct-F16-*":
            "the direct depthwise kernel with an F16 kernel tensor reads past it (7 of 8 samples, caught by "
            "the proof) or computes other values (NMSE 2.6): F16 kernels are not what it reads",
        "tests/test_opinfo.py::test_op_matches_reference[concat-Q8_0-0]":
            "CONCAT of Q8_0 reads past its source (caught by the proof)",
        "tests/test_opinfo.py::test_op_matches_reference[concat-Q8_0-1]":
            "CONCAT of Q8_0 reads past its source (caught by the proof)",
        "tests/test_opinfo.py::test_op_matches_reference[concat-Q8_0-2]":
            "CONCAT of Q8_0 reads past its source (caught by the proof)",
        "tests/test_opinfo.py::test_op_matches_reference[flash_attn_ext-F32-13]":
            "the tiled-path sample of 64 queries: 896 of its 1,024 outputs are NaN (the float64 reference is "
            "finite everywhere), silently",
        "tests/test_opinfo.py::test_op_matches_reference[flash_attn_ext-F16-13]":
            "the tiled-path sample of 64 queries: 896 of its 1,024 outputs are NaN, silently",
        "tests/test_opinfo.py::test_op_matches_reference[interpolate-F32-6]":
            "NEAREST | ALIGN_CORNERS maps pixels otherwise than later releases (NMSE 0.57)",
        "tests/test_opinfo.py::test_op_matches_reference[interpolate-F32-18]":
            "NEAREST | ALIGN_CORNERS maps pixels otherwise than later releases (NMSE 4.1)",
        "tests/test_rules_conv.py::test_nearby_resizes_still_build_and_compute":
            "its interpolate (NEAREST | ALIGN_CORNERS) maps pixels otherwise than later releases",
        "tests/test_rules_attention.py::test_rope_mode_the_kernel_lacks":
            "its rope kernel computes an unknown mode (4, 10) instead of aborting: the refusal stands for "
            "later kernels' abort; on 0.9.4 it stops values of a mode that does not exist",
        "tests/test_rules_backward.py::test_rule_refuses_what_the_kernel_fails_on[rope_ext_back: unknown mode]":
            "its rope kernel computes an unknown mode instead of aborting (as the forward's)",
        "tests/test_rules_conv.py::test_conv_2d_dw_direct_types":
            "the direct depthwise kernel reads past an F16 kernel tensor where later ones abort",
        "tests/test_rules_conv.py::test_conv_transpose_2d_negative_stride":
            "CONV_TRANSPOSE_2D's kernel asserts an F16 kernel tensor (aborts) before the stride's overrun",
        "tests/test_rules_conv.py::test_pool_rows_contiguous":
            "POOL_1D of rows that are not contiguous writes past its result (caught by the proof)",
        "tests/test_rules_conv.py::test_pool_1d_rows_evenly_spaced":
            "POOL_1D of rows unevenly spaced computes without overrunning there",
        "tests/test_rules_layout.py::test_concat_quantized_needs_contiguous_rows":
            "CONCAT of quantized rows that are not contiguous reads past its source where later kernels abort",
    },
}


def known_failure(nodeid: str, ggml_version: str) -> str | None:
    """Why the test ``nodeid`` is expected to fail on that release (None: it is not). A key
    ending in ``*`` names every parameter that starts so (``...[top_k-*``)."""
    known = KNOWN_FAILURES.get(ggml_version, {})
    why = known.get(nodeid) or known.get(nodeid.split("[", 1)[0])
    if why:
        return why
    return next((w for k, w in known.items() if k.endswith("*") and nodeid.startswith(k[:-1])), None)
