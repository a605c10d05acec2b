"""Attacks on the secure sum through Flower's own message path (issue 19).

tests/unit/test_secure_adversaries.py plays the attacks in process. Here a malicious ServerApp
(tests/integration/flower_attack_app: a relay around ghofl's FlowerTransport, and a server that
splits the survivor views) runs against ghofl's ClientApp handler on Flower's simulation engine
(Ray on 127.0.0.1): five nodes with identity keys, a roster and a round ledger beside their
data (repeated rounds allowed, on purpose), one ``flwr run``, six rounds of protocol version 3:
an honest one (the exact sum), key substitution by the relay, split survivor views, share
boxes withheld to force complaints, a threshold outside the nodes' policy, and a rerun under
the honest round's id. The honest nodes refuse each attack with its reason, and the attacker
never holds a share of the victim's secrets, nor opens any share box.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.client.job import ClientJob, client_statistics
from ghofl.integrations.flower.runner import LocalFlower
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.stats.client_stats import sum_stats
from ghofl.stats.codec import load_stats
from tests.helpers import gaussian_mixture

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parent / "flower_attack_app"
N = 5
CLIP = 30.0
CLASSES = ("0", "1", "2")
SITES = [f"site-{i}" for i in range(N)]


def _federation(root: Path) -> dict[str, Any]:
    """Each node's rows in parts/client-<i>.npz; identity keys site-<i>.key and roster.json."""
    x, y = gaussian_mixture(3, num_classes=3, dim=4, n=300)
    (root / "parts").mkdir(parents=True)
    for i in range(N):
        np.savez(root / "parts" / f"client-{i}.npz", x=x[i::N], y=y[i::N])
    ids = root / "ids"
    ids.mkdir()
    keys = {}
    for name in SITES:
        keys[name] = key = IdentityKey.generate()
        key.save(ids / f"{name}.key", name)
    Roster({n: k.public for n, k in keys.items()}).save(ids / "roster.json")
    return {"identities": str(ids), "classes": json.dumps(list(CLASSES)), "clip_norm": CLIP,
            "dim": 4, "data-template": str(root / "parts" / "client-{partition_id}.npz"),
            "out-dir": str(root / "out"), "wait-timeout-s": 60.0, "stage-timeout-s": 30.0}


def test_attacks_through_flower_are_refused_and_the_honest_round_is_exact(
        tmp_path: Path) -> None:
    cfg = _federation(tmp_path)
    flower = LocalFlower(tmp_path / "work", "simulation")
    try:
        flower.__enter__()
        res = flower.run(cfg, app_dir=APP, num_supernodes=N, timeout_s=300)
    finally:
        flower.close()
    assert flower.survivors() == [], "processes started by the test survived"
    assert res["status"] == "ok", (res.get("error"), res.get("traceback"))
    assert res["bound"] == SITES and res["identity_problems"] == {}

    # the same path, untampered: every node in the sum, which is exact
    honest = res["honest"]
    assert honest["status"] == "ok" and sorted(honest["survivors"]) == SITES
    assert honest["refused"] == {}
    job = ClientJob(CLASSES, clip_norm=CLIP)
    expected = sum_stats(client_statistics(tmp_path / "parts" / f"client-{i}.npz", job)
                         for i in range(N))
    total = load_stats(tmp_path / "out" / "honest.ghs")
    np.testing.assert_array_equal(total.counts, expected.counts)
    assert total.allclose(expected, rtol=1e-12)

    # key substitution: every other node refuses the relayed roster before it reveals its
    # nonce, let alone seals a share to the substituted keys
    swap = res["key_substitution"]
    assert swap["status"] == "aborted"
    assert "aborted at the reveal stage: 4 of the 5 relayed clients revealed no valid graph " \
           "nonce" in swap["error"], swap["error"]
    refused = swap["refused"]["reveal"]
    assert sorted(refused) == [s for s in SITES if s != "site-1"]
    assert all("the keys relayed for 'site-1': their signature does not verify against the "
               "federation's roster (substituted or altered keys)" in why
               for why in refused.values()), refused
    assert swap["shares_sealed_to_victim"] == 0  # nothing the relay's keys could open
    assert swap["masked_inputs"] == [] and swap["stages"] == ["advertise", "reveal"]

    # split views: neither survivor set collects t = 4 signatures, so nobody unmasks
    split = res["split_view"]
    assert split["status"] == "aborted" and "answered the unmask stage" in split["error"]
    assert split["stages"] == ["advertise", "reveal", "share", "mask", "consistency",
                               "unmask"]
    refused = split["refused"]["unmask"]
    assert sorted(refused) == SITES
    assert all("survivors signed the survivor set it was shown, below the threshold 4" in why
               for why in refused.values()), refused
    assert "site-0" in split["masked_inputs"]  # the victim's masked vector, never unmasked
    assert split["unmask_shares"] == [] and split["victim_shares_released"] == 0

    # withheld share boxes: in protocol version 2 every node complained and handed over its
    # private key; now every node refuses to send its masked input, and reveals nothing
    forced = res["forced_complaints"]
    assert forced["status"] == "aborted", forced
    assert "only 0 of 5 clients sent valid masked inputs" in forced["error"], forced["error"]
    assert forced["stages"] == ["advertise", "reveal", "share", "mask"]
    refused = forced["refused"]["mask"]
    assert sorted(refused) == SITES and sorted(forced["withheld"]) == SITES
    for site, why in refused.items():
        assert "to send its masked input: 1 share boxes of its neighbours are missing or " \
               "unverifiable" in why, why
        assert f"({forced['withheld'][site]!r})" in why, (forced["withheld"], why)
        assert "more than the 0 its policy tolerates" in why, why
    assert forced["masked_inputs"] == [] and forced["unmask_shares"] == []
    assert forced["boxes_relayed"] == N * (N - 1)  # complete graph over five: 4 boxes each
    assert forced["values_sent_at_mask_or_later"] == 0  # no pair key, no private key
    assert forced["opener_self_check"] == [1, 1, 0]  # the attacker's opener does open boxes
    assert forced["boxes_opened"] == 0  # ... but no value any node sent opens one

    # a threshold outside every node's own policy is refused at once
    lax = res["lax_params"]
    assert lax["status"] == "aborted" and sorted(lax["refused"]["advertise"]) == SITES
    assert all("threshold t=2 for 5 clients; this client accepts t between 4 and 5" in why
               for why in lax["refused"]["advertise"].values())
    assert lax["stages"] == ["advertise"] and lax["masked_inputs"] == []

    # a rerun under the honest round's id (to difference the totals): every node's ledger
    # refuses the round id at once, and nothing beyond the advertise stage happens
    replay = res["replay"]
    assert replay["round_id"] == honest["round_id"]
    assert replay["status"] == "aborted" and sorted(replay["refused"]) == ["advertise"]
    assert sorted(replay["refused"]["advertise"]) == SITES
    assert all("a round id already used" in why
               for why in replay["refused"]["advertise"].values()), replay["refused"]
    assert replay["stages"] == ["advertise"] and replay["masked_inputs"] == []
    assert len({r["round_id"] for k, r in res.items()
                if isinstance(r, dict) and "round_id" in r and k != "replay"}) == 5

    # without a ledger, the session binding stops a replay: the honest round's consistency
    # signatures verify in their own run only
    binding = res["session_binding"]
    assert binding["sessions_differ"] is True
    assert binding["signatures"] == binding["valid_in_own_run"] == N
    assert binding["valid_in_other_run"] == 0
    print(f"flwr run wall time: {res['wall_s']:.1f} s")
