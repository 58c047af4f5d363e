"""What every tests/test_rules_<family>.py needs, once: a refusal asserted with its class,
message and defect id, and a node's values computed with pyggml's rules off."""

import pytest

import pyggml
from pyggml.opinfo.harness import read, rules_disabled

SCRATCH = 64 << 20          # one context size for every rule test's builds


def refused(build, cls, match, defect=None):
    """``build(ctx)`` raises ``cls`` matching ``match``; an UpstreamDefect carries the id
    ``defect``, and a refusal that is not about a defect is not an UpstreamDefect.
    Returns the exception."""
    with pyggml.Context(SCRATCH) as ctx:
        with pytest.raises(cls, match=match) as e:
            build(ctx)
    if defect is not None:
        assert e.value.defect == defect
    elif not issubclass(cls, pyggml.UpstreamDefect):
        assert not isinstance(e.value, pyggml.UpstreamDefect), e.value
    return e.value


def compute_unchecked(build, n_threads=1):
    """The values of ``build(ctx)``'s node computed with the rules off (the graph is
    proven first: a refusal the proof turns into an exception is not a wrong value)."""
    with rules_disabled(), pyggml.Context(SCRATCH) as ctx:
        t = build(ctx)
        g = pyggml.Graph(ctx, 64)
        g.build_forward_expand(t)
        g.compute(n_threads)
        return read(t)
