"""The noise levels of a differentially private release survive files (issue 41).

A released total saved with :func:`save_stats` keeps its public noise σ_b (header entry
``noise_sigma``) and reloads as :class:`NoisyStats`, so ``ghofl fit`` on the file makes the
noise-aware choices of an in-process fit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.heads.lda import LDAHead
from ghofl.heads.registry import load_head
from ghofl.heads.ridge import RidgeHead
from ghofl.privacy.postprocess import NoisyStats
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import load_stats, read_stats_header, save_stats
from ghofl.stats.header import StatsHeader
from ghofl.stats.meta import Mode
from tests.helpers import dp_release, gaussian_mixture
from tests.helpers_cli import run_cli

R = 4.0
C, D = 3, 12


def _file_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, read directly."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta: dict[str, str] = json.loads(raw[8:8 + n])["__metadata__"]
    return meta


def _release(mode: Mode, z: float = 1.0, seed: int = 0) -> tuple[ClientStats, ClientStats]:
    """Exact total of a toy problem and its release at noise multiplier z (equal split)."""
    x, y = gaussian_mixture(seed, num_classes=C, dim=D, n=1500, sep=2.0)
    total = compute_stats(x, y, C, mode, clip_norm=R)
    return total, dp_release(total, R, z, seed=seed)


@pytest.mark.parametrize("mode", ["pooled", "full", "gram"])
def test_saved_release_reloads_with_its_noise_levels(tmp_path: Path, mode: Mode) -> None:
    _, noisy = _release(mode)
    assert isinstance(noisy, NoisyStats)
    save_stats(noisy, tmp_path / "t.ghs")
    back = load_stats(tmp_path / "t.ghs")
    assert isinstance(back, NoisyStats) and back.noise_sigma == noisy.noise_sigma
    for name in ("counts", "sums", "sq_sums", "class_scatter", "scatter"):
        a, b = getattr(noisy, name), getattr(back, name)
        if a is None:
            assert b is None
        else:
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=0)
    header = read_stats_header(tmp_path / "t.ghs")
    assert header.noise_sigma == noisy.noise_sigma and header.schema_version == 3
    raw = _file_metadata(tmp_path / "t.ghs")
    assert json.loads(raw["noise_sigma"]) == noisy.noise_sigma and raw["schema_version"] == "3"


def test_plain_statistics_are_written_as_before(tmp_path: Path) -> None:
    total, _ = _release("pooled")
    save_stats(total, tmp_path / "t.ghs")
    raw = _file_metadata(tmp_path / "t.ghs")
    assert "noise_sigma" not in raw and raw["schema_version"] == "2"
    back = load_stats(tmp_path / "t.ghs")
    assert type(back) is ClientStats


def test_the_fit_from_the_file_equals_the_fit_in_process(tmp_path: Path) -> None:
    _, noisy = _release("pooled", z=2.0)
    save_stats(noisy, tmp_path / "t.ghs")
    back = load_stats(tmp_path / "t.ghs")
    for head, attrs in ((LDAHead(), ("shrinkage_", "shrinkage_method_")),
                        (RidgeHead(), ("alpha_", "alpha_rule_"))):
        here, there = head.fit_from_stats(noisy), type(head)().fit_from_stats(back)
        assert [getattr(here, a) for a in attrs] == [getattr(there, a) for a in attrs]
    assert LDAHead().fit_from_stats(back).shrinkage_method_ == "analytic-error+dp-noise"
    assert RidgeHead().fit_from_stats(back).alpha_rule_ == "gcv+dp-noise"


def test_ghofl_fit_on_a_saved_release_uses_its_noise(tmp_path: Path) -> None:
    _, noisy = _release("pooled", z=2.0)
    save_stats(noisy, tmp_path / "total.ghs")
    r = run_cli("fit", "total.ghs", "--heads", "lda,ridge", "--out", "model", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lda, ridge = (load_head(tmp_path / "model" / f"{h}.ghh") for h in ("lda", "ridge"))
    here_lda, here_ridge = LDAHead().fit_from_stats(noisy), RidgeHead().fit_from_stats(noisy)
    assert lda.shrinkage_ == here_lda.shrinkage_  # type: ignore[attr-defined]
    assert lda.shrinkage_method_ == "analytic-error+dp-noise"  # type: ignore[attr-defined]
    assert ridge.alpha_ == here_ridge.alpha_  # type: ignore[attr-defined]
    assert ridge.alpha_rule_ == "gcv+dp-noise"  # type: ignore[attr-defined]
    card = (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert "analytic-error+dp-noise" in card and "gcv+dp-noise" in card


@pytest.mark.parametrize(("entry", "match"), [
    ('{"sums": -1.0}', "noise_sigma"),
    ('{"bogus": 1.0}', "noise_sigma"),
    ("{}", "noise_sigma"),
    ("[1, 2]", "noise_sigma"),
    ("not json", "noise_sigma"),
])
def test_a_malformed_noise_entry_is_refused(entry: str, match: str) -> None:
    _, noisy = _release("pooled")
    entries = StatsHeader.of(noisy).to_entries("file")
    entries["noise_sigma"] = entry
    with pytest.raises(StatsFormatError, match=rf"has header {match} .*expected a JSON object "
                                               r"of block names to noise standard deviations"):
        StatsHeader.from_entries(entries, "file", "'t.ghs'")


def test_a_version_2_file_cannot_hold_noise_levels() -> None:
    _, noisy = _release("pooled")
    entries = {**StatsHeader.of(noisy).to_entries("file"), "schema_version": "2"}
    with pytest.raises(StatsFormatError, match="has schema version 2 but a noise_sigma, which "
                                               "version 3 introduced"):
        StatsHeader.from_entries(entries, "file", "'t.ghs'")


def test_records_carry_the_noise_levels() -> None:
    _, noisy = _release("pooled")
    entries = StatsHeader.of(noisy).to_entries("records")
    assert json.loads(entries["noise-sigma"]) == noisy.noise_sigma
    assert StatsHeader.from_entries(entries, "records", "r").noise_sigma == noisy.noise_sigma


def test_lower_modes_keep_the_levels_of_their_blocks() -> None:
    _, noisy = _release("full")
    assert isinstance(noisy, NoisyStats)
    s = noisy.noise_sigma
    pooled = noisy.to_mode("pooled")
    assert isinstance(pooled, NoisyStats)
    assert pooled.noise_sigma["scatter"] == pytest.approx(math.sqrt(C) * s["class_scatter"])
    assert pooled.noise_sigma["sq_sums"] == s["class_scatter"]
    assert pooled.to_mode("pooled") is pooled
    means = pooled.to_mode("means")
    assert isinstance(means, NoisyStats) and means.noise_sigma == pooled.noise_sigma


def test_a_release_is_not_added_to_other_statistics_on_either_side() -> None:
    total, noisy = _release("pooled")
    for op in (lambda: noisy + total, lambda: total + noisy, lambda: total - noisy,
               lambda: noisy - total):
        with pytest.raises(StatsValidationError, match=r"not added to other statistics .*add "
                                                       r"the exact statistics, then release"):
            op()
    assert sum([noisy]) is noisy  # type: ignore[comparison-overlap]


def test_bad_levels_are_refused() -> None:
    total, _ = _release("pooled")
    with pytest.raises(StatsValidationError, match=r"noise_sigma must map every block .*unknown "
                                                   r"block 'bogus'"):
        NoisyStats.of(total, {"bogus": 1.0})
    held = compute_stats(*gaussian_mixture(1, num_classes=C, dim=D, n=200), C, "pooled",
                         holdout_fraction=0.2)
    with pytest.raises(StatsValidationError, match="has no held-out section; drop it"):
        NoisyStats.of(held, {"sums": 1.0})


def test_a_header_with_bad_levels_is_refused() -> None:
    _, noisy = _release("pooled")
    with pytest.raises(StatsValidationError, match=r"noise_sigma is \{'sums': -1.0\}; expected "
                                                   r"a JSON object of block names"):
        StatsHeader(noisy.meta, noise_sigma={"sums": -1.0})
