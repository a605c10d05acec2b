"""The stage exchange pulls replies at a short interval and stops at the deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from ghofl.integrations.flower.transport import send_and_receive


@dataclass
class FakeGrid:
    """Replies to message i become available at ``ready[i]`` seconds after the push."""

    ready: list[float | None]
    pulls: int = 0
    t0: float = 0.0
    pulled: set[str] = field(default_factory=set)

    def push_messages(self, messages: list[Any]) -> list[str]:
        self.t0 = time.monotonic()
        return [f"m{i}" for i in range(len(messages))]

    def pull_messages(self, ids: set[str]) -> list[Any]:
        self.pulls += 1
        now = time.monotonic() - self.t0
        out = []
        for i, at in enumerate(self.ready):
            mid = f"m{i}"
            if mid in ids and mid not in self.pulled and at is not None and now >= at:
                self.pulled.add(mid)
                out.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid)))
        return out


def test_returns_as_soon_as_every_reply_is_in() -> None:
    grid = FakeGrid([0.0, 0.15, 0.3])
    t0 = time.monotonic()
    replies = send_and_receive(grid, [object()] * 3, timeout_s=30.0, poll_s=0.05)
    took = time.monotonic() - t0
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0", "m1", "m2"]
    assert took < 5.0  # far below the timeout: it did not wait for it
    assert grid.pulls >= 3


@pytest.mark.parametrize("timeout_s", [0.2, 0.5])
def test_a_missing_reply_ends_the_stage_at_its_deadline(timeout_s: float) -> None:
    grid = FakeGrid([0.0, None])
    t0 = time.monotonic()
    replies = send_and_receive(grid, [object()] * 2, timeout_s=timeout_s, poll_s=0.05)
    took = time.monotonic() - t0
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert timeout_s - 0.01 <= took < timeout_s + 2.0


def test_no_messages_pull_nothing() -> None:
    grid = FakeGrid([])
    assert send_and_receive(grid, [], timeout_s=1.0) == []
    assert grid.pulls == 0
