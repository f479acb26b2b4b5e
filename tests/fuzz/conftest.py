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
# max_examples is per test; the fuzz tests scale it per test with `examples(weight)`.
settings.register_profile("ci", max_examples=12, derandomize=True, **_COMMON)
settings.register_profile("deep", max_examples=200, **_COMMON)


def pytest_configure(config):
    """No --hypothesis-profile given: the ci profile."""
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile("ci")
