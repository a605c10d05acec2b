"""A client of a vector round saved and restored between every stage (as Flower's ClientApp)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ghofl.errors import ProtocolError
from ghofl.secure import (
    IdentityKey,
    Roster,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    VectorMeta,
    VectorPayload,
)
from ghofl.secure.protocol import CountedReplies, stage_report
from ghofl.secure.transport import InMemoryTransport

META = VectorMeta("evaluation", (10, 10, 1), (5.0, 2.5))


def _payloads() -> dict[str, VectorPayload]:
    rng = np.random.default_rng(3)
    high = np.asarray(META.int_bounds) + 1
    return {f"c{i}": VectorPayload(META, rng.integers(0, high).astype(np.int64),
                                   rng.uniform(0, 2.5, 2)) for i in range(4)}


def test_a_vector_client_resumes_from_its_state_at_every_stage() -> None:
    payloads = _payloads()
    keys = {c: IdentityKey.generate() for c in payloads}
    roster = Roster.from_identities(keys)
    server = SecAggServer(SecAggConfig(clip_norm=1.0, threshold=3, max_samples=10), META,
                          list(payloads), roster=roster)
    states = {c: SecAggClient(c, p, identity=keys[c], roster=roster, ledger=None).to_state()
              for c, p in payloads.items()}
    for _stage in server.stages:
        replies = []
        for c, request in server.requests().items():
            client = SecAggClient.from_state(states[c], payloads[c], identity=keys[c],
                                             roster=roster, ledger=None)
            assert client.meta == META
            replies.append((c, client.handle(request)))
            states[c] = client.to_state()
        server.receive(replies)
    total = server.vector_result()
    np.testing.assert_array_equal(total.ints, sum(p.ints for p in payloads.values()))
    np.testing.assert_allclose(total.floats, sum(p.floats for p in payloads.values()),
                               rtol=0, atol=1e-12)
    assert {json.loads(str(s["meta"]))["format"] for s in states.values()} == {"ghofl.vector"}
    assert {s["state"] for s in states.values()} == {"done"}


def test_a_malformed_vector_state_is_refused() -> None:
    payloads = _payloads()
    state = SecAggClient("c0", payloads["c0"], allow_unauthenticated=True).to_state()
    broken = {**state, "meta": json.dumps({"format": "ghofl.vector", "name": "evaluation"})}
    with pytest.raises(ProtocolError, match="saved client state is malformed"):
        SecAggClient.from_state(broken, payloads["c0"], allow_unauthenticated=True)


def test_the_stage_report_helpers_are_public() -> None:
    transport = InMemoryTransport([], None)
    replies = CountedReplies(iter([]))
    assert list(replies) == [] and replies.count == 0
    report = stage_report("advertise", transport, {}, replies, 0.5)
    assert report.replies == 0 and report.server_seconds == pytest.approx(0.5)
