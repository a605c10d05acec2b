"""A :class:`~ghofl.server.plan.FederationPlan` from a flat run config (TOML, Flower).

The keys are those of :data:`~ghofl.server.fields.FIELDS` (``docs/file-formats.md`` shows the
table); a broken rule of the plan is reported in the config's vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ghofl.client.job import ClientJob, ConfigValue
from ghofl.errors import ConfigError, FieldError
from ghofl.secure.fixedpoint import DEFAULT_MAX_SAMPLES
from ghofl.server.fields import CONFIG, FIELDS
from ghofl.server.plan import (
    THREAT_MODEL_DEFAULTS,
    AggregationSpec,
    FederationPlan,
    default_min_class_count,
)

if TYPE_CHECKING:
    from ghofl.privacy import DPConfig

__all__ = ["cfg_float", "cfg_int", "cfg_str", "plan_from_config", "plan_to_config"]


def plan_from_config(cfg: Mapping[str, Any]) -> FederationPlan:
    """The plan of a run config (``protocol`` defaults to ``"secure"``).

    Raises
    ------
    ConfigError
        A key holds an invalid value, or a rule of the plan is broken; the message names the
        config keys.
    """
    try:
        return _plan(cfg)
    except FieldError as exc:
        raise ConfigError(f"run config: {exc.render(CONFIG)}") from None


def plan_to_config(plan: FederationPlan) -> dict[str, ConfigValue]:
    """The run config of ``plan``: ``plan_from_config(plan_to_config(plan)) == plan``.

    Simulated drops (``aggregation.drops``) have no run-config key and are left out; regions
    are the key ``regions`` (0 = one flat round; a Flower run then runs each region's round
    over that region's nodes, :func:`ghofl.integrations.flower.server_app.run_federation`).

    Returns
    -------
    dict
        Every key of :data:`~ghofl.server.fields.FIELDS` but ``drop``, flat
        (strings, numbers, booleans), as a Flower run config or a TOML table holds them.
    """
    agg = plan.aggregation
    cfg: dict[str, ConfigValue] = {**plan.client.to_config(), **plan.server.to_config()}
    cfg["min-class-count"] = cfg.pop("min_class_count")
    cfg.update({
        "protocol": agg.protocol, "threshold": agg.threshold or 0,
        "neighbours": agg.neighbours or 0, "max-samples": agg.max_samples, "limbs": agg.limbs,
        **{FIELDS[f"aggregation.{name}"].key: float(getattr(agg, name))
           for name in THREAT_MODEL_DEFAULTS},
        "store": agg.store, "regions": agg.regions or 0,
        "dp-epsilon": 0.0 if agg.dp is None else float(agg.dp.epsilon),
    })
    if agg.dp is not None:
        cfg.update({"dp-delta": float(agg.dp.delta), "dp-mode": agg.dp.mode,
                    "dp-split": agg.dp.split,
                    "dp-expected-samples": int(agg.dp.expected_samples or 0)})
    return cfg


def _plan(cfg: Mapping[str, Any]) -> FederationPlan:
    job = ClientJob.from_config(cfg)
    eps = cfg_float(cfg, "dp-epsilon", 0.0)
    dp = None if eps == 0.0 else dp_config(cfg, eps)
    k = cfg_int(cfg, "min-class-count", 0)
    if k < 0:
        raise ConfigError(f"run config key 'min-class-count' must be >= 0; got {k}")
    job = replace(job, min_class_count=k or (default_min_class_count(dp) if dp is not None
                                             else job.min_class_count))
    protocol = cfg_str(cfg, "protocol", "secure")
    threat = {name: cfg_float(cfg, FIELDS[f"aggregation.{name}"].key, default)
              for name, default in THREAT_MODEL_DEFAULTS.items()}
    agg = AggregationSpec(
        protocol=protocol,  # type: ignore[arg-type]
        threshold=cfg_int(cfg, "threshold") or None,
        neighbours=cfg_int(cfg, "neighbours") or None,
        max_samples=cfg_int(cfg, "max-samples", DEFAULT_MAX_SAMPLES),
        limbs=cfg_int(cfg, "limbs", 2), dp=dp, store=cfg_str(cfg, "store"),
        regions=cfg_int(cfg, "regions") or None,
        corrupt_fraction=threat["corrupt_fraction"], dropout_fraction=threat["dropout_fraction"],
        sigma=threat["sigma"], eta=threat["eta"])
    from ghofl.server.job import ServerJob  # the server's modules, on first use

    return FederationPlan(job, agg, ServerJob.from_config(cfg))


def dp_config(cfg: Mapping[str, Any], epsilon: float) -> DPConfig:
    """The run config's DP keys as a :class:`~ghofl.privacy.DPConfig` (``dp-epsilon`` > 0).

    ``dp-delta``, ``dp-mode``, ``dp-split`` and ``dp-expected-samples`` (0: unknown).
    """
    from ghofl.privacy import DEFAULT_DELTA, DPConfig

    n = cfg_int(cfg, "dp-expected-samples", 0)
    if n < 0:
        raise ConfigError(f"run config key 'dp-expected-samples' must be >= 0 (0: unknown); "
                          f"got {n}")
    return DPConfig(epsilon, cfg_float(cfg, "dp-delta", DEFAULT_DELTA),
                    cfg_str(cfg, "dp-mode", "central"),  # type: ignore[arg-type]
                    split=cfg_str(cfg, "dp-split", "auto"), expected_samples=n or None)


def cfg_str(cfg: Mapping[str, Any], key: str, default: str = "") -> str:
    """``cfg[key]`` as a string (``default`` when absent)."""
    value = cfg.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"run config key {key!r} must be a string; got {value!r}")
    return value


def cfg_int(cfg: Mapping[str, Any], key: str, default: int = 0) -> int:
    """``cfg[key]`` as an integer (``default`` when absent)."""
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"run config key {key!r} must be an integer; got {value!r}")
    return int(value)


def cfg_float(cfg: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    """``cfg[key]`` as a number (``default`` when absent)."""
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"run config key {key!r} must be a number; got {value!r}")
    return float(value)
