"""What the suite is known to fail on a ggml release other than the pinned one, and why.

Each entry is a finding about that release, measured there (``python
scripts/ci_upstream.py --ggml SPEC``, the spec's log): a test of a kernel rule written
against the pinned ggml 0.20.2 whose kernel has changed since. conftest.py marks the
tests an entry names ``xfail(strict=True)`` when that release is linked, so the suite's
verdict there reads "nothing else changed": a new failure fails the run, and so does an
entry that stops failing (a rule reviewed, a kernel changed back), as XPASS(strict),
until it is taken out. A key is a test's node id, without its parameters (every
parameter of it) or with them (that one).

ggml 0.25.3 (``sdist:llama-cpp-python==0.3.36``), 2026-12-03: 28 tests failed before
this list, 12 of them for causes the tests now handle (a builder that refuses an
oversized result itself, conv-transpose-2d-batch fixed, ROPE's overrun tests on a
kernel that spins instead). The 16 below are **false refusals**: pyggml's 0.20.2 rule
refuses what the 0.25.3 kernel computes without aborting (its kernel is untrusted there,
so a graph that got through would still be proven first). They are what the rule
reviews of the pin move (issue 24) must lift.
"""

FALSE_REFUSAL = "false refusal on this ggml: pyggml's 0.20.2 rule refuses what the changed kernel runs: "

KNOWN_FAILURES: dict[str, dict[str, str]] = {
    "0.25.3": {
        "tests/test_rules_glu.py::test_glu_refuses_bf16":
            FALSE_REFUSAL + "GLU's kernel computes a BF16 a (kernel verdict 'ok'; 0.20.2 aborts)",
        "tests/test_rules_activation.py::test_gelu_like_refuse_bf16":
            FALSE_REFUSAL + "GELU, GELU_ERF, GELU_QUICK and SILU compute a BF16 a (verdict 'ok'; 0.20.2 aborts)",
        "tests/test_rules_conv.py::test_conv_2d_dw_with_an_f32_kernel_is_not_computable_on_the_cpu":
            FALSE_REFUSAL + "MUL_MAT takes the F16 columns of conv_2d_dw with an F32 kernel (verdict 'ok'; "
                            "0.20.2 aborts)",
        "tests/test_rules_layout.py::test_concat_quantized_needs_whole_blocks":
            FALSE_REFUSAL + "CONCAT of a Q8_0 view of partial blocks no longer aborts (verdict 'ok'; its values "
                            "not yet checked)",
    },
}


def known_failure(nodeid: str, ggml_version: str) -> str | None:
    """Why the test ``nodeid`` is expected to fail on that release (None: it is not)."""
    known = KNOWN_FAILURES.get(ggml_version, {})
    return known.get(nodeid) or known.get(nodeid.split("[", 1)[0])
