"""Which line a warning names: the first of the user's code.

`warnings.warn(stacklevel=N)` counts frames up from the call. A helper that
several public functions reach, directly or through others (`predict`,
`evaluate` through `prepare`, `fit` through its phases), named a library
line on some of those paths, and a notebook shows that line's source above
the message instead of the user's call. `user_stacklevel()` counts the
frames instead, past tft-jax, qat and properties and the libraries they run
inside (JAX and Flax trace a user's module; `contextlib` runs the library's
context managers), so the user's own Flax module that calls one of our layers
is named too.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

_LIBRARIES = ("tft_jax", "qat", "properties", "jax", "jaxlib", "flax", "optax", "orbax", "chex")


def _library_folders() -> tuple[str, ...]:
    """The folders of the packages of `_LIBRARIES` this process has imported."""
    folders = []
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folders.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(folders)


def _in_library(frame: FrameType, folders: tuple[str, ...]) -> bool:
    """Whether `frame` runs code of the libraries: by its module (a dataclass's generated
    `__init__`, whose file is `<string>`, runs in its class's module; a namespace package
    such as orbax has no folder), else by its file."""
    module = frame.f_globals.get("__name__")
    if isinstance(module, str) and module.partition(".")[0] in _LIBRARIES:
        return True
    filename = frame.f_code.co_filename
    return os.path.basename(filename) == "contextlib.py" or os.path.abspath(filename).startswith(
        folders
    )


def user_stacklevel() -> int:
    """The `stacklevel` for `warnings.warn` called by this function's caller that names the
    first frame outside the libraries (the outermost frame if every one is inside)."""
    folders = _library_folders()
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and (
        _in_library(frame, folders) or _in_import_system(frame.f_code.co_filename)
    ):
        frame = frame.f_back
        # `warnings` steps over the import system's frames without counting them.
        if not _in_import_system(frame.f_code.co_filename):
            level += 1
    return level


def _in_import_system(filename: str) -> bool:
    """Whether `warnings` skips this frame when it counts `stacklevel` (CPython's rule)."""
    return "importlib" in filename and "_bootstrap" in filename
