"""Every exception the Python layer raises on bad input is a pyggml.GGMLError (and the
builtin a caller expects), as the README promises: attention_backward and opt.fit used to
raise plain ValueError and TypeError."""

import numpy as np
import pytest

import pyggml
from pyggml import opt
from pyggml.errors import ArgumentError, GGMLError, GGMLTypeError

Q = np.zeros((1, 2, 4, 8), np.float32)


@pytest.mark.parametrize("call, cls, builtin", [
    (lambda: pyggml.attention_backward(Q, Q, Q, Q, kernel="nonesuch"), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q, Q, Q, mapping="diagonal"), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q[:, :, :2], Q[:, :, :2], Q, masked=True), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q, Q, Q.astype(np.float64)), GGMLTypeError, TypeError),
    (lambda: pyggml.attention_backward(Q.tolist(), Q, Q, Q), GGMLTypeError, TypeError),
    (lambda: pyggml.attention_backward(Q, Q[..., :4], Q[..., :4], Q), ArgumentError, ValueError),
    (lambda: pyggml.attention_backward(Q, Q, Q, Q, scale=0.0), ArgumentError, ValueError),
    (lambda: pyggml.flash_attn_back_grads(None), GGMLTypeError, TypeError),
])
def test_attention_entry_points_raise_ggml_errors(call, cls, builtin):
    with pytest.raises(cls) as info:
        call()
    assert isinstance(info.value, GGMLError) and isinstance(info.value, builtin)


@pytest.mark.parametrize("kw, match", [({"nepoch": 0}, "nepoch"), ({"nepoch": 1, "val_split": 1.5}, "val_split")])
def test_fit_raises_ggml_errors(kw, match):
    with pytest.raises(ArgumentError, match=match) as info:
        opt.fit(None, None, **kw)
    assert isinstance(info.value, ValueError)
