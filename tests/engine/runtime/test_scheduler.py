"""engine/scheduler: when a scheduling point can be skipped (no other actor could run),
and that the same seed gives the same interleaving when it cannot."""

from __future__ import annotations

from pallas_check.engine.runtime.scheduler import Actor, Scheduler


def _actor(name, log, points):
    def body():
        for i in range(points):
            log.append(f"{name}{i}")
            yield None
    return Actor(name, body())


def test_alone_only_with_one_actor_and_no_timeline():
    s = Scheduler(seed=0)
    s.spawn(_actor("a", [], 1))
    assert s.alone
    s.observer = object()  # a timeline counts every step: none may be skipped
    assert not s.alone
    s.observer = None
    s.spawn(_actor("dma", [], 1))  # a DMA of `random` mode is an actor of its own
    assert not s.alone


def test_interleavings_depend_on_the_seed_alone():
    def run(seed):
        log: list[str] = []
        s = Scheduler(seed=seed)
        s.run([_actor("a", log, 20), _actor("b", log, 20)])
        return log

    runs = {seed: run(seed) for seed in range(12)}
    assert all(run(seed) == log for seed, log in runs.items())
    assert len({tuple(log) for log in runs.values()}) > 1  # two actors do interleave
