"""Where a cde_st warning points (cde_st/modules/warning_location.py): at the user's line, through any depth of cde_st,
sentence-transformers and torch calls."""

from __future__ import annotations

import inspect
import warnings

from cde_st.modules.warning_location import caller_stacklevel


def test_a_warning_from_deep_inside_encode_names_the_users_line(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    model.clear_context()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        model.encode(["a text"])  # encode -> forward -> the module's context state warns (no context set)
    (warning,) = [w for w in caught if "No context is set" in str(w.message)]
    assert warning.filename == __file__ and warning.lineno == line


def test_outside_the_library_the_stacklevel_is_the_direct_caller():
    def warn_here():
        warnings.warn("from a test helper", UserWarning, stacklevel=caller_stacklevel())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_here()
    (warning,) = caught
    assert warning.filename == __file__
    assert warning.lineno == inspect.getsourcelines(warn_here)[1] + 1  # the warns line itself: level 1
