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
"""

# {ggml version: {test node id (with or without its parameters): why it fails there}}
KNOWN_FAILURES: dict[str, dict[str, str]] = {}


def known_failure(nodeid: str, ggml_version: str) -> str | None:
    """Why the test ``nodeid`` is expected to fail on that release (None: it is not)."""
    known = KNOWN_FAILURES.get(ggml_version, {})
    return known.get(nodeid) or known.get(nodeid.split("[", 1)[0])
