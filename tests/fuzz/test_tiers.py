"""The compiled tier against the engine on generated kernels (tests/fuzz/kernels.py).

Property: a call run with `--tier compiled` gives the engine's outputs bit for bit and the
same finding kinds (none: the generated kernels are valid), or is refused for a reason the
eligibility rules name (`pallas_check/compiled/eligibility.py`, or the kernel body while it
is traced). Races are on, so a compiled run's race bit is exercised too; DMA kernels run in
both `on_wait` and `eager` modes.

Profiles (tests/fuzz/conftest.py): "ci" runs a few examples; `--hypothesis-profile=deep`
runs 200 per test.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from hypothesis import event, given, settings

from pallas_check.config import Config, DmaMode, Tier
from pallas_check.intercept.session import Session

from .conftest import examples
from .kernels import Kernel, build, kernels, operands

# The ci profile's examples are shared by every fuzz test; this property runs each kernel
# four times (two tiers, two DMA modes), so it takes fewer of them (deep: 200).
_EXAMPLES = examples(2)


def check_tiers(check, desc: Kernel, modes: tuple[DmaMode, ...]) -> None:
    tables, arrays = operands(desc)
    fn = build(desc)
    for mode in modes:
        base = Config(races=True, dma_mode=mode)
        engine = check(fn, *tables, *arrays, config=dataclasses.replace(base, tier=Tier.ENGINE))
        compiled = _compiled(check, fn, [*tables, *arrays], base)
        if isinstance(compiled, str):
            refused = compiled
            assert "cannot run compiled:" in refused, refused
            event(f"refused: {refused.split('cannot run compiled: ')[-1]}")
            continue
        tiers = {c.tier for c in compiled.session.calls}
        assert tiers == {"compiled"} or all(c.tier_reason for c in compiled.session.calls
                                            if c.tier == "engine"), tiers
        event(f"tiers={sorted(tiers)}")
        assert sorted(engine.kinds()) == sorted(compiled.kinds()), (mode, engine.kinds(),
                                                                    compiled.kinds())
        want, got = engine.value, compiled.value
        want_leaves = want if isinstance(want, (list, tuple)) else [want]
        got_leaves = got if isinstance(got, (list, tuple)) else [got]
        for w, g in zip(want_leaves, got_leaves, strict=True):
            assert np.array_equal(np.asarray(w), np.asarray(g), equal_nan=True), (
                mode, np.asarray(w), np.asarray(g))


def _compiled(check, fn, args, base: Config):
    """The run under `--tier compiled`, or the one-line refusal it ended with."""
    session = Session(dataclasses.replace(base, tier=Tier.COMPILED))
    try:
        with session.install():
            jax.block_until_ready(fn(*args))
    except Exception:  # noqa: BLE001 - the refusal reaches the script as JAX's error
        assert session.engine_error is not None and session.error_code == 2
        return session.engine_error
    return check(fn, *args, config=session.config)


@settings(max_examples=_EXAMPLES)
@given(desc=kernels(dma=False))
def test_compiled_tier_matches_engine(check, desc):
    check_tiers(check, desc, (DmaMode.ON_WAIT,))


@settings(max_examples=_EXAMPLES)
@given(desc=kernels(dma=True))
def test_compiled_tier_matches_engine_with_dmas(check, desc):
    check_tiers(check, desc, (DmaMode.ON_WAIT, DmaMode.EAGER))
