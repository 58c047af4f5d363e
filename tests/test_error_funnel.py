"""One funnel from pyggml's C runtime to its exceptions (pyggml/_core_errors.pxi): every
checked C entry point fills one record (pyggml_status, csrc/status.c), one Cython
function maps its code to the class from one table. Each code's exception is checked
here with a record made up for it; the paths that produce each code for real are
tested where they happen (test_rules_*, test_graph, test_backend, test_opt, ...)."""

import errno
import re
from pathlib import Path

import pytest

import pyggml
from pyggml import _core
from pyggml.errors import GGMLError

ROOT = Path(__file__).resolve().parent.parent
CODES, COUNT = _core._status_codes()
NOT_FAILURES = {"PYGGML_OK", "PYGGML_UNCHECKED"}


def test_the_table_covers_every_failure_code():
    assert sorted(CODES.values()) == list(range(COUNT))
    failures = {v for k, v in CODES.items() if k not in NOT_FAILURES}
    assert set(_core._STATUS_TABLE) == failures
    for code, (cls, template, extra) in _core._STATUS_TABLE.items():
        assert issubclass(cls, GGMLError) or cls is OSError, cls
        assert template.startswith("{where}: ") and "{detail}" in template


@pytest.mark.parametrize("name", sorted(set(CODES) - NOT_FAILURES))
def test_each_code_raises_its_class_with_its_fields(name):
    code = CODES[name]
    cls = _core._STATUS_TABLE[code][0]
    with pytest.raises(cls) as e:
        _core._raise_for_status(code, how=7, msg="why, in words", defect="kernel-out-of-bounds", where="here")
    text = e.value.strerror if cls is OSError else str(e.value)
    assert text.startswith("here: ") and "why, in words" in text, text
    if cls is pyggml.UpstreamDefect:
        assert e.value.defect == "kernel-out-of-bounds"
    if issubclass(cls, pyggml.GGMLAbort):
        assert e.value.ggml_message == "why, in words"
    if cls is pyggml.KernelTimeout:
        assert e.value.seconds == 0.007      # the record counts milliseconds
    if cls is pyggml.ComputeError:
        assert e.value.status == "why, in words"
    if cls is OSError:
        assert e.value.errno == 7


@pytest.mark.parametrize("name, want", [("PYGGML_PROOF_SIGNAL", "(signal 7)"), ("PYGGML_PROOF_EXIT", "(exit 7)"),
                                        ("PYGGML_PROOF_TIMEOUT", "did not finish in the proof's 0.007 s"),
                                        ("PYGGML_BAD_INDEX", "(the nodes before it have run)")])
def test_the_number_of_a_record_is_in_its_message(name, want):
    with pytest.raises(GGMLError, match=re.escape(want)):
        _core._raise_for_status(CODES[name], how=7, msg="m")


def test_not_failures_raise_nothing():
    for name in NOT_FAILURES:
        assert _core._raise_for_status(CODES[name], msg="ignored") == 0


def test_an_unknown_code_is_an_internal_error():
    with pytest.raises(pyggml.InternalError, match="code 999.*please report"):
        _core._raise_for_status(999, msg="m")


def test_a_system_failure_without_errno_is_still_an_oserror():
    with pytest.raises(OSError) as e:
        _core._raise_for_status(CODES["PYGGML_SYSTEM"], how=0, msg="fork")
    assert e.value.errno == errno.EIO


@pytest.mark.skipif(not (ROOT / "pyggml" / "csrc").exists(), reason="needs the source tree")
def test_no_other_place_maps_a_failure_code_to_an_exception():
    # the failure codes appear in the funnel, and elsewhere only where a caller acts on
    # one before raising it (the backends made unusable by a C++ exception)
    failure = re.compile(r"\bPYGGML_(" + "|".join(n[len("PYGGML_"):] for n in sorted(set(CODES) - NOT_FAILURES))
                         + r")\b")
    allowed = {"_core_errors.pxi": None, "_backend.pyx": {"OUT_OF_MEMORY", "CXX_EXCEPTION"}}
    for path in sorted((ROOT / "pyggml").glob("*.py*")):
        if path.suffix not in (".pyx", ".pxi"):
            continue
        found = set(failure.findall(path.read_text()))
        if path.name in allowed:
            assert allowed[path.name] is None or found <= allowed[path.name], (path.name, found)
        else:
            assert not found, f"{path.name} maps C failure codes itself: {sorted(found)}"
        # nor reads ggml's status names or the dry run's codes itself
        text = path.read_text()
        assert "ggml_status_to_string" not in text and "PYGGML_DRY_" not in text, path.name
