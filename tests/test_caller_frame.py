"""`tft_jax.caller_frame.user_stacklevel`: a warning names the user's line, however deep
in the library it is raised, and the public paths that reach one helper by several routes
all name the caller."""

from __future__ import annotations

import pathlib
import warnings

import tft_jax
from tft_jax.caller_frame import user_stacklevel

LIBRARY = pathlib.Path(tft_jax.__file__).parent

# Functions compiled as if they were files of the library: their frames are the library's.
_SOURCE = """
import warnings
from tft_jax.caller_frame import user_stacklevel

def warn_here():
    warnings.warn("deep", UserWarning, stacklevel=user_stacklevel())

def through(callback):
    return callback()

def deeper():
    return through(warn_here)
"""


def _library_functions() -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile(_SOURCE, str(LIBRARY / "_probe_helpers.py"), "exec"), namespace)
    return namespace


def _caught(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return caught


def test_a_warning_raised_deep_in_the_library_names_the_users_line():
    library = _library_functions()
    caught = _caught(lambda: library["deeper"]())  # named: deeper
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("deeper"))]


def test_a_users_callback_between_library_frames_is_the_line_named():
    # The user's Flax module calls one of our layers: its line, not the library's caller.
    library = _library_functions()

    def users_module():
        return library["warn_here"]()  # named: callback

    caught = _caught(lambda: library["through"](users_module))
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("callback"))]


def test_a_warning_raised_in_the_users_own_code_names_that_line():
    def own():
        warnings.warn("own", UserWarning, stacklevel=user_stacklevel())  # named: own

    caught = _caught(own)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("own"))]


def _marked(name: str) -> int:
    """The number of the line of this file that ends with the comment `# named: {name}`."""
    lines = pathlib.Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines) if line.endswith(f"# named: {name}")) + 1
