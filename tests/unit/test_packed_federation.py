"""Payloads read packed through the plain protocol and ``ghofl aggregate`` (issue 40).

``ghofl aggregate`` without a store, FedCOF or a DP release reads every payload packed
(``load_packed_stats``) and its server adds them so: the total, every refusal and its message
are those of reading them whole. The flat layout of packed statistics is that of the values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.errors import StatsValidationError
from ghofl.secure.plain import PlainClient, PlainServer
from ghofl.stats import ClientStats, PackedStats, compute_stats, load_stats, save_stats, sum_stats
from ghofl.stats.schema import schema_for

CLASSES = ("a", "b", "c")


def _stats(seed: int, mode: str = "full", holdout: float = 0.0,
           clip: float | None = None) -> ClientStats:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((30 + seed, 6)) + 0.5
    y = rng.integers(0, 2 if seed % 2 else 3, x.shape[0])
    return compute_stats(x, y, CLASSES, mode=mode, holdout_fraction=holdout,  # type: ignore[arg-type]
                         holdout_seed=seed, clip_norm=clip)


def _equal(a: ClientStats, b: ClientStats) -> None:
    for name, arr in a.arrays().items():
        other = getattr(b, name)
        assert (arr is None) == (other is None)
        if arr is not None:
            assert np.array_equal(arr, other), name
    assert a.n_clipped == b.n_clipped and a.meta == b.meta
    if a.holdout is not None:
        assert b.holdout is not None
        _equal(a.holdout, b.holdout)


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag", "means"])
@pytest.mark.parametrize("holdout", [0.0, 0.3])
def test_packed_statistics_flatten_as_their_values(mode: str, holdout: float) -> None:
    s = _stats(1, mode, holdout)
    for target in ("full", "pooled", "gram", "diag", "means"):
        if not schema_for(mode).supports(target):  # type: ignore[arg-type]
            continue
        ints, floats = schema_for(target).flatten(s)  # type: ignore[arg-type]
        p_ints, p_floats = schema_for(target).flatten(PackedStats.of(s))  # type: ignore[arg-type]
        assert np.array_equal(ints, p_ints) and np.array_equal(floats, p_floats)


def test_the_plain_server_adds_packed_payloads_and_hands_values_to_on_accept() -> None:
    payloads = [_stats(k, clip=40.0) for k in range(3)]
    accepted: list[tuple[str, object]] = []
    server = PlainServer(["c0", "c1", "c2"], on_accept=lambda c, s: accepted.append((c, s)))
    req = server.requests()
    replies = [(f"c{k}", PlainClient(f"c{k}", PackedStats.of(s) if k != 1 else s)
                .handle(req[f"c{k}"])) for k, s in enumerate(payloads)]
    server.receive(replies)
    _equal(server.result(), sum_stats(payloads))
    assert [c for c, _ in accepted] == ["c0", "c1", "c2"]
    assert all(isinstance(s, ClientStats) for _, s in accepted)
    _equal(accepted[0][1], payloads[0])  # type: ignore[arg-type]


def test_the_plain_server_refuses_a_packed_payload_out_of_its_bounds() -> None:
    s = _stats(2, clip=1.0)  # every row was clipped to norm 1: n_clipped counts them
    arrays: dict[str, Any] = {n: np.array(a) for n, a in PackedStats.of(s).arrays().items()
                              if a is not None}
    arrays["sums"] = arrays["sums"] * 3.0  # |A_c| > N_c·R: no clipping at R = 1 yields it
    arrays["class_scatter"] = arrays["class_scatter"] * 9.0
    bad = PackedStats(s.meta, n_clipped=s.n_clipped, **arrays)
    server = PlainServer(["c0"], threshold=1)
    reply = PlainClient("c0", bad).handle(server.requests()["c0"])
    with pytest.raises(Exception, match=r"aggregation aborted: 0 of 1 clients sent valid "
                       r"statistics.*c0: input: sent statistics that .* cannot produce"):
        server.receive([("c0", reply)])


@pytest.mark.parametrize("mode", ["full", "pooled"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ghofl_aggregate_reads_packed_to_the_same_total(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, dtype: str) -> None:
    payloads = [_stats(k, mode, holdout=0.25) for k in range(4)]
    files = []
    for k, s in enumerate(payloads):
        files.append(tmp_path / f"c{k}.ghs")
        save_stats(s, files[-1], transport_dtype=dtype)
    read: list[str] = []
    from ghofl.stats.codec import load_packed_stats as real

    def counting(path: Path) -> PackedStats:
        read.append(Path(path).name)
        return real(path)

    monkeypatch.setattr("ghofl.cli.io.load_packed_stats", counting)
    assert main(["aggregate", *map(str, files), "--out", str(tmp_path / "total.ghs")]) == 0
    assert read == [p.name for p in files]  # every payload read packed
    _equal(load_stats(tmp_path / "total.ghs"), sum_stats(load_stats(p) for p in files))
    read.clear()
    store = tmp_path / "store"
    assert main(["aggregate", *map(str, files), "--store", str(store)]) == 0
    assert read == []  # a store records each payload: read whole


def test_ghofl_aggregate_refuses_a_corrupt_payload_as_before(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    good, s = tmp_path / "good.ghs", _stats(3)
    save_stats(s, good)
    cs = np.array(s.class_scatter)
    cs[0, 2, 2] = -1.0  # a negative sum of squares
    bad = tmp_path / "bad.ghs"
    save_stats(ClientStats._trusted(s.meta, counts=s.counts, sums=s.sums, class_scatter=cs), bad)
    with pytest.raises(StatsValidationError):
        load_stats(bad)
    rc = main(["aggregate", str(good), str(bad), "--out", str(tmp_path / "t.ghs")])
    err = capsys.readouterr().err
    assert rc != 0 and not (tmp_path / "t.ghs").exists()
    assert f"'{bad}' holds invalid statistics: sums of squares (D_c or diag S_c) must be " \
           "non-negative; the payload is corrupt" in err
