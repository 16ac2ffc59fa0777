"""The JAX platforms present on this machine, and a pytest parametrization over them.

A property that holds on CPU should hold on GPU and TPU too (different
kernels, fusion and reduction orders). `parametrize()` runs a test once per
platform, skipping, with a reason, the platforms JAX does not find::

    from properties import backends

    @backends.parametrize()
    @given(st_tft.attention_configs(), st_tft.data())
    def test_block(platform, config, data):
        with backends.on_platform(platform):   # jit places work on that platform
            ...

CPU is always present. Inside `on_platform`, `jax.jit` compiles for and runs
on the platform's first device (`jax.default_device`); NumPy inputs are
transferred there at the jit boundary.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax

__all__ = [
    "PLATFORMS",
    "available_platforms",
    "current_platform",
    "device",
    "on_platform",
    "parametrize",
]

PLATFORMS = ("cpu", "gpu", "tpu")


@functools.cache
def _devices(platform: str) -> tuple[Any, ...]:
    """The devices of one platform, or () when JAX has no backend for it."""
    try:
        return tuple(jax.devices(platform))
    except RuntimeError:
        return ()


def _check_platform(platform: Any) -> str:
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
    return platform


def available_platforms() -> tuple[str, ...]:
    """The platforms of `PLATFORMS` on which JAX finds at least one device (always "cpu")."""
    return tuple(platform for platform in PLATFORMS if _devices(platform))


def device(platform: str) -> Any:
    """The first device of `platform`.

    Raises:
      ValueError: when `platform` is unknown or JAX finds no device of it.
    """
    devices = _devices(_check_platform(platform))
    if not devices:
        raise ValueError(
            f"JAX finds no {platform} device on this machine (available: {available_platforms()})"
        )
    return devices[0]


@contextlib.contextmanager
def on_platform(platform: str) -> Iterator[Any]:
    """Context manager making the first device of `platform` the default device; yields it."""
    target = device(platform)
    with jax.default_device(target):
        yield target


def current_platform() -> str:
    """The platform jitted computations run on now (the default device's)."""
    default = jax.config.jax_default_device  # type: ignore[attr-defined]  # a flag jax adds at runtime
    if default is None:
        return jax.devices()[0].platform
    if isinstance(default, str):
        return default
    return default.platform


def parametrize(argname: str = "platform", platforms: Sequence[str] = PLATFORMS) -> Any:
    """`pytest.mark.parametrize` over `platforms`, absent ones skipped with a reason.

    Args:
      argname: the test argument that receives the platform name.
      platforms: the platforms to run on (a subset of `PLATFORMS`).
    """
    import pytest

    if isinstance(platforms, str):  # a bare name would be read letter by letter
        raise TypeError(
            f"platforms must be a sequence of platform names, got the string {platforms!r}"
        )
    if not isinstance(platforms, Iterable):
        raise TypeError(f"platforms must be a sequence of platform names, got {platforms!r}")
    platforms = tuple(_check_platform(platform) for platform in platforms)
    if not platforms:
        raise ValueError("platforms must name at least one platform, got ()")
    if len(set(platforms)) != len(platforms):  # two tests with one id
        raise ValueError(f"platforms must name each platform once, got {platforms}")
    present = available_platforms()
    params = [
        pytest.param(
            platform,
            id=platform,
            marks=pytest.mark.skipif(
                platform not in present, reason=f"JAX finds no {platform} device"
            ),
        )
        for platform in platforms
    ]
    return pytest.mark.parametrize(argname, params)
