"""The Hypothesis profiles the property suite runs in: `dev`, `ci` and `thorough`.

- `dev`: 5 examples per property, for a quick local run.
- `ci`: 15 examples, derandomized (every run draws the same examples, so a
  compiled shape bucket is reused from the persistent compilation cache).
- `thorough`: 200 examples.

All three have no deadline (the first example of a shape compiles) and
accept slow data generation. Importing this module registers them (it loads
none): put ``import properties.profiles`` in your `conftest.py`, then choose
one with ``pytest --hypothesis-profile=ci`` or `settings.load_profile`.
Without it, `ci` is Hypothesis' own profile of that name (100 examples).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings

from properties.suite import CI_EXAMPLES

__all__ = ["PROFILES"]

_COMMON: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}
PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 5, **_COMMON},
    "ci": {"max_examples": CI_EXAMPLES, "derandomize": True, **_COMMON},
    "thorough": {"max_examples": 200, **_COMMON},
}

for _name, _options in PROFILES.items():
    settings.register_profile(_name, **_options)
