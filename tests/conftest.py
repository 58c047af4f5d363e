import numpy as np
import pytest

try:
    import pyggml
    import pyggml._core  # noqa: F401
except ImportError as e:  # pragma: no cover - a setup problem, not a test failure
    raise pytest.UsageError(
        f"pyggml is not built/installed ({e}). Install it first (`pip install .[test]`) and run "
        "`pytest` from the repository root, not `python -m pytest` (which puts the source tree, "
        "without the compiled module, first on sys.path)."
    ) from None


@pytest.fixture
def ctx():
    with pyggml.Context(64 * 1024 * 1024) as c:
        yield c


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def compute(ctx, t, n_threads=2):
    """Build a graph ending in ``t`` in ``ctx``, compute it, return t's data as a copy."""
    g = pyggml.Graph(ctx)
    g.build_forward_expand(t)
    g.compute(n_threads)
    return t.numpy().copy()
