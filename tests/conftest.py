import faulthandler
import os
import sys

import numpy as np
import pytest
from hypothesis import settings

# CI runs the same examples every time (a red CI then means a change, not a lucky draw);
# local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

try:
    import pyggml
    import pyggml._core  # noqa: F401
except ImportError as e:  # pragma: no cover - a setup problem, not a test failure
    raise pytest.UsageError(
        f"pyggml is not built/installed ({e}). Install it first (`pip install .[test]`) and run "
        "`pytest` from the repository root, not `python -m pytest` (which puts the source tree, "
        "without the compiled module, first on sys.path)."
    ) from None


def _malloc_trim():
    """glibc's malloc_trim, or None (another C library)."""
    import ctypes
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def trim_heap():
    """Give the heap's freed pages back to the system (glibc; elsewhere nothing)."""
    if _trim is not None:
        _trim(0)


def pytest_runtest_teardown(item, nextitem):
    """After a test module, give the heap's freed pages back to the system. A worker's heap
    keeps what its tests freed, and every forked proof copies the page tables of all of it:
    on a 2-core VM a fork cost 12 ms at 140 MiB and 50 ms at 600 MiB, the suite's tests
    fork a few thousand times, and the release specs of scripts/ci_upstream.py (no kernel
    trusted) once per graph. Measured: 343 -> 226 MiB, a fork 28 -> 18.5 ms, for 23 ms."""
    if nextitem is None or nextitem.module is not item.module:
        trim_heap()


@pytest.fixture
def ctx():
    with pyggml.Context(64 * 1024 * 1024) as c:
        yield c


@pytest.fixture
def quiet_faulthandler():
    """pytest's faulthandler, enabled after conftest imported pyggml, sees a fault (SIGFPE,
    SIGSEGV) before pyggml's guard does: it prints "Fatal Python error" and passes the
    signal on. Off for the duration of a test that makes a guarded call fault on purpose."""
    was = faulthandler.is_enabled()
    faulthandler.disable()
    yield
    if was:
        faulthandler.enable(file=sys.__stderr__)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def compute(ctx, t, n_threads=2):
    """Build a graph ending in ``t`` in ``ctx``, compute it, return t's data as a copy."""
    g = pyggml.Graph(ctx)
    g.build_forward_expand(t)
    g.compute(n_threads)
    return t.numpy().copy()


def needs_op(name):
    """skip unless the linked ggml has builder ``name`` with the table's signature (a test
    run against an older ggml by scripts/ci_upstream.py)"""
    from pyggml import _optable

    row = next(r for r in _optable.OPS if r["name"] == name)
    return pytest.mark.skipif(not row["available"], reason=row.get("reason") or f"{name} not in this ggml")


def pytest_collection_modifyitems(config, items):
    """The tests known to fail on the linked ggml release (tests/expectations.py) are
    strict xfails there: any other failure, or one of them passing, fails the run."""
    from expectations import known_failure

    version = pyggml.ggml_version()
    for item in items:
        why = known_failure(item.nodeid, version)
        if why:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"ggml {version}: {why}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test the linked release refuses itself is skipped, saying why: a feature this ggml
    lacks (GGMLVersionError), or an abort pyggml caught on a ggml its rules do not cover
    (pyggml.opinfo.harness.release_abort, the sweep's rule too). Anything else a test raises
    fails it, and on the releases the rules cover, so does every abort."""
    try:
        return (yield)
    except (pyggml.GGMLVersionError, pyggml.GGMLAbort) as e:
        from pyggml.opinfo.harness import release_abort

        why = release_abort(e)
        if why is None:
            raise
        pytest.skip(why)
