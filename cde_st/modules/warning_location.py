"""Where a cde_st warning points: the user's line, however deep the library calls between it and the warning."""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

# Code between the user and a warning (cde_st itself, and the libraries that call its modules): a warning names the
# first frame outside these, the line that encoded or loaded.
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (
        os.path.dirname(__file__),  # cde_st/modules: its folder, cde_st/, is what counts
        torch.__file__,
        importlib.util.find_spec("sentence_transformers").origin,
        importlib.util.find_spec("transformers").origin,
    )
)


def caller_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` in the function that calls this one: the first frame outside cde_st,
    torch, sentence-transformers and transformers (the user's line, however deep the library calls are)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level
