"""What every checker shares: the call it listens to and the sink its findings go to."""

from __future__ import annotations

from pallas_check.engine.events import CallFacts, FindingSink, Listener


class Checker(Listener):
    """A listener that emits findings (engine/events.py); one per simulation of a call."""

    def __init__(self, call: CallFacts, sink: FindingSink) -> None:
        self.call = call
        self.sink = sink
