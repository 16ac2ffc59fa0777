"""Paths as users give them: a leading `~` is the home folder, as in a shell and in pandas."""

from __future__ import annotations

import os
import pathlib

__all__ = ["expanded"]


def expanded(path: str | os.PathLike[str]) -> pathlib.Path:
    """`path` with a leading `~` (or `~user`) expanded as pandas expands the paths it reads.

    Every place a user names a path expands it through here, once, so that
    all the components of one command (pandas, orbax, `pathlib`) see one
    path: kept as typed, some read `~/run` as the home folder's and others as
    a folder named `~` in the current one. A `~user` of no user here stays as
    typed, as the shell leaves it (`pathlib.Path.expanduser` raised).

    Expanding twice gives the same path: a `~` left as typed (`./~/x`, whose
    './' `pathlib` drops, or a `~user` of no user) is anchored at the current
    folder, where a second expansion would have taken it for the home folder.
    """
    result = pathlib.Path(os.path.expanduser(os.fspath(path)))
    if result.parts and result.parts[0].startswith("~"):
        return pathlib.Path.cwd() / result
    return result
