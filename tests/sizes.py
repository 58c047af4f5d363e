"""The sizes of the tests' long computes, said once.

Under scripts/sanitize.py (``PYGGML_SANITIZED=1``) ggml's kernels run about 10 times slower,
so the computes that other threads interrupt, close or race against do 1/8 of the work there.
"""

import os

SANITIZED = os.environ.get("PYGGML_SANITIZED") == "1"

# the side of the square F32 matrices those computes multiply
LONG_N = 512 if SANITIZED else 1024
