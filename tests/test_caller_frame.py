"""`tft_jax.caller_frame.user_stacklevel`: a warning names the user's line, however deep
in the library it is raised, and the public paths that reach one helper by several routes
all name the caller."""

from __future__ import annotations

import os
import pathlib
import sys
import warnings

import tft_jax
from tft_jax import caller_frame
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


# C02: caller_frame.py user_stacklevel: the import system's frames counted (`warnings`
# steps over them without counting): a warning raised while a library module is imported
# named a frame above the user's `import` line.
def test_a_warning_raised_while_a_library_module_is_imported_names_the_users_import(
    tmp_path, monkeypatch
):
    (tmp_path / "_probe_imported.py").write_text(
        "import warnings\n"
        "from tft_jax.caller_frame import user_stacklevel\n"
        "warnings.warn('on import', UserWarning, stacklevel=user_stacklevel())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "_probe_imported", raising=False)
    # The probe's folder counts as a library's, as tft_jax's own modules do.
    monkeypatch.setattr(caller_frame, "_library_folders", lambda: (str(tmp_path) + os.sep,))

    def users_import():
        import _probe_imported  # noqa: F401  # named: import

    try:
        caught = _caught(users_import)
    finally:
        sys.modules.pop("_probe_imported", None)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("import"))]


# C03: caller_frame.py _in_library: contextlib's frames not stepped over: a warning of a
# library context manager's entry named contextlib.py instead of the user's `with`.
_CONTEXT_SOURCE = """
import contextlib
import warnings
from tft_jax.caller_frame import user_stacklevel

@contextlib.contextmanager
def warning_context():
    warnings.warn("entered", UserWarning, stacklevel=user_stacklevel())
    yield
"""


def test_a_warning_of_a_library_context_manager_names_the_users_with():
    namespace: dict[str, object] = {}
    exec(compile(_CONTEXT_SOURCE, str(LIBRARY / "_probe_context.py"), "exec"), namespace)

    def users_with():
        with namespace["warning_context"]():  # named: with
            pass

    caught = _caught(users_with)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("with"))]


# A Flax module's (a dataclass's) generated `__init__` has the file "<string>" but runs in
# its class's module: it counts as the library's.
_GENERATED = """
import warnings
from tft_jax.caller_frame import user_stacklevel

def __init__():
    warnings.warn("built", UserWarning, stacklevel=user_stacklevel())
"""


def test_a_frame_of_generated_code_counts_by_its_module_not_its_file():
    namespace: dict[str, object] = {"__name__": "qat.model"}
    exec(compile(_GENERATED, "<string>", "exec"), namespace)
    caught = _caught(lambda: namespace["__init__"]())  # named: generated
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("generated"))]


def test_a_qat_tft_built_with_a_layout_field_names_the_users_line(monkeypatch):
    # It named "<string>" (Flax's dataclass __init__) after the stacklevels were counted.
    import qat
    import qat.config
    from tft_jax import TFTConfig

    monkeypatch.setattr(qat.config, "_ANNOUNCED_LAYOUTS", set())

    layout = qat.QATConfig(symmetric=False)

    def build():
        return qat.QATTemporalFusionTransformer(TFTConfig(), layout)  # named: qat

    caught = _caught(build)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, _marked("qat"))], [
        str(w.message) for w in caught
    ]
