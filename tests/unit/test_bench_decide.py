"""The one comparison rule of the DP sections (ghofl.bench.decide)."""

from __future__ import annotations

import math

import pytest

from ghofl.bench.decide import at_or_above, fmt_mean_se, mean_se, paired_lead, within
from ghofl.errors import ConfigError


def test_mean_se_is_the_standard_error_of_the_mean() -> None:
    m, se = mean_se([0.70, 0.72, 0.74, 0.76])
    assert m == pytest.approx(0.73)
    assert se == pytest.approx(0.025819888974716 / 2)
    one = mean_se([0.5])
    assert one[0] == 0.5 and math.isnan(one[1])


def test_at_or_above_allows_two_standard_errors_of_the_difference() -> None:
    a, b = [0.70, 0.71, 0.72], [0.72, 0.73, 0.74]  # diff -2 pt, se of diff 0.816 pt
    cmp = at_or_above(a, b)
    assert cmp.diff == pytest.approx(-2.0) and cmp.se == pytest.approx(math.sqrt(2 / 3))
    assert cmp.passed is False  # -2 < -2 * 0.816
    wide = at_or_above([0.66, 0.71, 0.76], [0.70, 0.73, 0.76])  # noisier: -2 pt passes
    assert wide.passed is True and wide.bound == pytest.approx(2 * wide.se)
    assert at_or_above(a, b, margin=2.5).passed is True


def test_within_is_two_sided_with_the_larger_of_tol_and_two_se() -> None:
    b = [0.70, 0.70, 0.70, 0.70]
    assert within([0.703, 0.705, 0.703, 0.705], b, 0.5).passed is True
    assert within([0.690, 0.690, 0.690, 0.690], b, 0.5).passed is False
    assert within([0.710, 0.710, 0.710, 0.710], b, 0.5).passed is False
    assert within([0.71, 0.71], b, 2.0).passed is True


def test_one_seed_is_undecided_not_passed_or_failed() -> None:
    cmp = at_or_above([0.5], [0.9, 0.91])
    assert cmp.passed is None and "undecided" in cmp.describe("yes", "no")
    assert within([0.5, 0.6], [0.5], 0.5).passed is None


def test_exact_reference_counts_only_the_other_side_error() -> None:
    cmp = at_or_above([0.965, 0.975, 0.985], [0.99], margin=2.0, b_exact=True)
    assert cmp.se == pytest.approx(100 * mean_se([0.965, 0.975, 0.985])[1])
    assert cmp.passed is True and cmp.diff == pytest.approx(-1.5)
    assert at_or_above([0.94, 0.95, 0.96], [0.99], margin=2.0, b_exact=True).passed is False


def test_describe_and_format() -> None:
    assert fmt_mean_se([0.70, 0.72]) == "71.0 ± 1.0"
    assert fmt_mean_se([0.7]) == "70.0"
    assert at_or_above([0.7, 0.72], [0.6, 0.62]).describe("ok", "bad") == "+10.0 ± 1.4 pt: ok"


def test_paired_lead_cancels_the_shared_seed_spread() -> None:
    # Both methods move together from seed to seed (spread 4 pt); a leads by 0.3-0.5 pt on
    # every seed: unpaired that is a tie, paired a decided lead.
    b = [0.80, 0.84, 0.88, 0.82]
    a = [0.804, 0.843, 0.885, 0.823]
    assert at_or_above(b, a).passed is True  # b is not decidedly below a unpaired
    cmp = paired_lead(a, b)
    assert cmp.diff == pytest.approx(0.375)
    assert cmp.se == pytest.approx(100 * mean_se([0.004, 0.003, 0.005, 0.003])[1])
    assert cmp.passed is True and cmp.bound == pytest.approx(2 * cmp.se)
    assert paired_lead(b, a).passed is False  # the reverse is no lead
    mixed = paired_lead([0.81, 0.80, 0.83], [0.80, 0.81, 0.82])  # +1, -1, +1: no lead
    assert mixed.passed is False
    assert paired_lead([0.9], [0.8]).passed is None


@pytest.mark.parametrize(("call", "match"), [
    (lambda: paired_lead([0.1, 0.2], [0.1]),
     r"one value of each method per seed; got 2 and 1 values.*at_or_above"),
    (lambda: mean_se([]), r"at least one per-seed value; got none"),
    (lambda: at_or_above([0.1, 0.2], [0.1, 0.2], margin=-1), r"margin must be >= 0"),
    (lambda: within([0.1, 0.2], [0.1, 0.2], -0.5), r"tol must be >= 0"),
    (lambda: at_or_above([0.1, 0.2], [0.1, 0.2], b_exact=True),
     r"b_exact=True needs one value for b .*pass b_exact=False"),
])
def test_bad_input_is_named(call: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()  # type: ignore[operator]
