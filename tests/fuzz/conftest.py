"""Hypothesis profiles of the differential fuzz tests.

- "ci" (the default): a few dozen examples over all fuzz tests, derandomized so that CI
  runs the same kernels every time.
- "deep": hundreds of examples, randomized: `pytest tests/fuzz --hypothesis-profile=deep`.

tests/conftest.py imports this module, so the profiles exist before hypothesis' pytest
plugin reads `--hypothesis-profile` (it loads the profile while pytest configures, before
this folder's conftest would otherwise be imported).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture,
                           HealthCheck.large_base_example],
)
# max_examples is per test; a fuzz test whose examples cost more takes fewer in ci with
# `examples(in_ci)`.
CI_EXAMPLES = 12
settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, **_COMMON)
settings.register_profile("deep", max_examples=200, **_COMMON)


def examples(in_ci: int) -> int:
    """A test's examples: `in_ci` under the ci profile (fewer where one example costs
    more), the loaded profile's own count otherwise (deep: 200)."""
    default = settings.default.max_examples
    return in_ci if default <= CI_EXAMPLES else default


def pytest_configure(config):
    """No --hypothesis-profile given: the ci profile."""
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile("ci")
