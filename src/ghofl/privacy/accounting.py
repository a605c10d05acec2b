"""Calibration of the Gaussian mechanism with ``dp-accounting`` (no formula written by hand).

One release of the aggregate is one Gaussian mechanism of noise multiplier z (noise standard
deviation z·Δ for L2 sensitivity Δ). Its privacy loss distribution is computed by the PLD
accountant of ``dp_accounting`` (pessimistic discretisation), and z is found by its
``calibrate_dp_mechanism`` search: the smallest z whose ε at δ is at most the target.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ghofl.errors import ConfigError, require_extra

__all__ = ["calibrate_noise_multiplier", "check_epsilon_delta", "gaussian_epsilon"]

#: Discretisation of the privacy loss (coarser than dp-accounting's default 1e-4, so faster;
#: the accountant is pessimistic, so a coarser grid only overstates ε, by less than 1e-3).
_PLD_INTERVAL = 1e-3


def check_epsilon_delta(epsilon: float, delta: float) -> tuple[float, float]:
    """``(epsilon, delta)`` as floats if 0 < ε < ∞ and 0 < δ < 1, else ConfigError."""
    ok_e = isinstance(epsilon, int | float) and not isinstance(epsilon, bool)
    if not ok_e or not (math.isfinite(float(epsilon)) and float(epsilon) > 0):
        raise ConfigError(
            f"the privacy budget epsilon must be a finite number > 0; got {epsilon!r}; "
            "omit the differential-privacy options for a run without noise"
        )
    ok_d = isinstance(delta, int | float) and not isinstance(delta, bool)
    if not ok_d or not 0.0 < float(delta) < 1.0:
        raise ConfigError(
            f"the privacy parameter delta must be a number strictly between 0 and 1 (e.g. "
            f"1e-5, below 1/n); got {delta!r}"
        )
    return float(epsilon), float(delta)


def _accountant() -> Any:
    require_extra("dp_accounting", "privacy")
    from dp_accounting import pld

    return pld.PLDAccountant(value_discretization_interval=_PLD_INTERVAL)


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """ε of one Gaussian mechanism with noise multiplier z at ``delta`` (dp-accounting PLD)."""
    require_extra("dp_accounting", "privacy")
    import dp_accounting

    acc = _accountant()
    acc.compose(dp_accounting.GaussianDpEvent(float(noise_multiplier)))
    return float(acc.get_epsilon(float(delta)))


@functools.lru_cache(maxsize=64)
def calibrate_noise_multiplier(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier z (σ = z·Δ) whose single release is (ε, δ)-DP.

    Parameters
    ----------
    epsilon : float
        Target ε > 0.
    delta : float
        Target δ in (0, 1).

    Returns
    -------
    float
        z, found by ``dp_accounting.calibrate_dp_mechanism`` over the PLD accountant.
    """
    eps, dlt = check_epsilon_delta(epsilon, delta)
    require_extra("dp_accounting", "privacy")
    import dp_accounting

    z = dp_accounting.calibrate_dp_mechanism(
        _accountant, dp_accounting.GaussianDpEvent, eps, dlt, tol=1e-5,
    )
    return float(z)
