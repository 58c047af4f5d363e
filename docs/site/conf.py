"""Sphinx configuration of pyggml's documentation site (built by scripts/build_docs.py,
which adds the generated pages: the op reference, the guides from the README, the API
reference's lists)."""

import pyggml

project = "pyggml"
author = "the pyggml developers"
copyright = "2026, the pyggml developers"
release = version = pyggml.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]   # napoleon: numpy-style docstrings
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_*.md"]   # _readme_intro.md: included by index.md

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_docstring_signature = True
autodoc_typehints = "none"

html_theme = "furo"
html_title = f"pyggml {release}"
html_static_path: list[str] = []
