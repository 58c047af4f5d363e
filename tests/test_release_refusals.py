"""What the suite and the sweep do with a sample the linked release refuses itself
(pyggml.opinfo.harness.release_abort): a feature that ggml lacks, or an abort pyggml caught
on a ggml whose kernels its rules were not written against, is a skip that says why;
on a ggml the rules cover, an abort is a failure, and a hang is one everywhere."""

import contextlib

import pytest

import conftest
import pyggml
from pyggml import _core
from pyggml.opinfo import harness
from pyggml.parity import subjects
from sources import built_from_the_pin


@contextlib.contextmanager
def one_kernel_untrusted(op=pyggml.Op.ADD):
    """as on a ggml where that op's kernel changed (a later tree, or a prebuilt one)"""
    was = _core._set_kernel_untrusted(op, True)
    try:
        yield
    finally:
        _core._set_kernel_untrusted(op, was)


ABORT = pyggml.GGMLAbort("add: ggml would abort: ggml.c:1: GGML_ASSERT(x) failed", "ggml.c:1: GGML_ASSERT(x) failed")
LACKS = pyggml.GGMLVersionError("xielu: not available with ggml 0.9.4: this ggml has no ggml_xielu")
HANG = pyggml.KernelTimeout("rope: the kernel did not finish in the proof's 5 s", "", 5.0)


def test_the_rules_cover_the_pin_and_not_a_ggml_with_a_changed_kernel():
    if built_from_the_pin():
        assert harness.rules_cover_the_linked_ggml()
    with one_kernel_untrusted():
        assert not harness.rules_cover_the_linked_ggml()


@contextlib.contextmanager
def linked_version(version):
    """as if the linked ggml said it were this release"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pyggml, "ggml_version", lambda: version)
        yield


def test_what_is_the_release_s_own_refusal():
    version = pyggml.ggml_version()
    pinned = pyggml.build_info()["kernels"]["pinned_release"]
    if version != pinned:
        assert harness.release_abort(LACKS).startswith(f"ggml {version} lacks what this sample needs: xielu")
    with linked_version("0.9.4"):
        assert harness.release_abort(LACKS).startswith("ggml 0.9.4 lacks what this sample needs: xielu")
    # the release the rules are written against lacks nothing pyggml offers: there a
    # GGMLVersionError is pyggml's defect, and fails the test
    with linked_version(pinned):
        assert harness.release_abort(LACKS) is None
    assert harness.release_abort(ValueError("x")) is None
    assert harness.release_abort(pyggml.KernelPreconditionError("refused")) is None
    with one_kernel_untrusted():
        assert harness.release_abort(ABORT).startswith(f"ggml {version} aborts on this sample (caught;")
        assert harness.release_abort(HANG) is None          # a hang is a defect wherever it is seen
    if harness.rules_cover_the_linked_ggml():
        assert harness.release_abort(ABORT) is None         # here an abort is pyggml's defect


def _hook_outcome(exc):
    """what conftest's pytest_runtest_call makes of a test that raised exc"""
    gen = conftest.pytest_runtest_call(None)        # a wrapper hook: a generator
    next(gen)
    try:
        gen.throw(exc)
    except pytest.skip.Exception as e:
        return "skipped: " + str(e.msg)
    except BaseException as e:       # noqa: BLE001 - whatever the test raised, passed on
        return "raised " + type(e).__name__
    return "returned"


def test_the_suite_skips_a_release_s_refusal_and_fails_on_anything_else():
    with linked_version("0.9.4"):
        assert _hook_outcome(LACKS).startswith("skipped: ggml 0.9.4 lacks")
    with linked_version(pyggml.build_info()["kernels"]["pinned_release"]):
        assert _hook_outcome(LACKS) == "raised GGMLVersionError"
    assert _hook_outcome(AssertionError("a wrong value")) == "raised AssertionError"
    with one_kernel_untrusted():
        assert _hook_outcome(ABORT).startswith("skipped: ggml ")
        assert _hook_outcome(HANG) == "raised KernelTimeout"
    if harness.rules_cover_the_linked_ggml():
        assert _hook_outcome(ABORT) == "raised GGMLAbort"


def test_the_sweep_says_skipped_for_a_release_s_refusal_and_error_otherwise():
    with linked_version("0.9.4"):
        assert subjects._outcome_of(LACKS).verdict == "skipped"
    with one_kernel_untrusted():
        got = subjects._outcome_of(ABORT)
        assert got.verdict == "skipped" and "aborts on this sample" in got.detail
        assert subjects._outcome_of(HANG).verdict == "error"
    if harness.rules_cover_the_linked_ggml():
        assert subjects._outcome_of(ABORT).verdict == "error"
