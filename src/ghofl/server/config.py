"""A :class:`~ghofl.server.plan.FederationPlan` from a flat run config (TOML, Flower), and back.

Both directions loop over :data:`~ghofl.server.fields.FIELDS` (``docs/file-formats.md`` shows
the table): each key holds its field's value as the field's codec, or its scalar, says; an
optional field's ``None`` travels as the empty string or 0. A key spelt with hyphens where the
table's has underscores (``dp-epsilon``) is refused, never ignored, and a broken rule of the
plan is reported in the config's vocabulary.

:func:`plan_from_values` builds the plan of field values given by plan field (what a run
config or a command line gives); :func:`client_job`, :func:`aggregation_spec` and
:func:`server_job` build one part each, so that a command can check one part before the data
it needs for the others is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, FieldError, FieldNames
from ghofl.server.fields import (
    CONFIG,
    FIELDS,
    REQUIRED,
    ConfigValue,
    FieldSpec,
    check_spellings,
    config_scalar,
    part_fields,
)
from ghofl.server.plan import AggregationSpec, FederationPlan, default_min_class_count

if TYPE_CHECKING:
    from ghofl.privacy import DPConfig
    from ghofl.server.job import ServerJob

__all__ = ["aggregation_spec", "cfg_float", "cfg_int", "cfg_str", "client_job", "config_values",
           "plan_from_config", "plan_from_values", "plan_to_config", "server_job"]


def plan_from_config(cfg: Mapping[str, Any]) -> FederationPlan:
    """The plan of a run config: each key of :data:`~ghofl.server.fields.FIELDS` it holds.

    A key it lacks, or holds at the default, leaves the field at its default (``protocol``:
    ``"plain"``); ``classes`` is required. Keys of no field (``out-dir``, ...) are ignored.

    Raises
    ------
    ConfigError
        A key holds an invalid value, is spelt with hyphens (``dp-epsilon`` for
        ``dp_epsilon``), or a rule of the plan is broken; the message names the config keys.
    """
    check_spellings(cfg)
    try:
        return plan_from_values(config_values(cfg))
    except FieldError as exc:
        raise ConfigError(f"run config: {exc.render(CONFIG)}") from None


def config_values(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The field values a run config gives, by plan field: its keys not at their default.

    Raises
    ------
    ConfigError
        A key holds a value of the wrong type.
    """
    values: dict[str, Any] = {}
    for spec in FIELDS.values():
        if spec.key and spec.key in cfg:
            value = spec.from_config(cfg[spec.key])
            if value is not None and value != spec.default:
                values[spec.path] = value
    return values


def plan_to_config(plan: FederationPlan) -> dict[str, ConfigValue]:
    """The run config of ``plan``: ``plan_from_config(plan_to_config(plan)) == plan``.

    Simulated drops (``aggregation.drops``) have no run-config key and are left out; regions
    are the key ``regions`` (0 = one flat round; a Flower run then runs each region's round
    over that region's nodes, :func:`ghofl.integrations.flower.server_app.run_federation`).

    Returns
    -------
    dict
        Every key of :data:`~ghofl.server.fields.FIELDS`, flat (strings, numbers, booleans),
        as a Flower run config or a TOML table holds them.
    """
    return {spec.key: spec.to_config(spec.value(plan)) for spec in FIELDS.values() if spec.key}


def plan_from_values(values: Mapping[str, Any]) -> FederationPlan:
    """The plan of the given field values, by plan field (``{"client.clip_norm": 2.0}``).

    A field not given (or ``None``) takes its default; ``client.min_class_count`` not given
    is :func:`~ghofl.server.plan.default_min_class_count` of the plan's DP.

    Raises
    ------
    PlanError
        A value is invalid, or a rule of the plan is broken (it names the field).
    """
    parts: dict[str, dict[str, Any]] = {"client": {}, "aggregation": {}, "server": {}}
    for path, value in values.items():
        spec = FIELDS[path]
        parts[spec.part][spec.name] = value
    aggregation = aggregation_spec(parts["aggregation"])
    client = parts["client"]
    if client.get("min_class_count") is None:
        client["min_class_count"] = default_min_class_count(aggregation.dp)
    return FederationPlan(client_job(client), aggregation, server_job(parts["server"]))


def client_job(values: Mapping[str, Any]) -> ClientJob:
    """The :class:`~ghofl.client.job.ClientJob` of client field values, by field name."""
    return ClientJob(**_given("client", values))


def aggregation_spec(values: Mapping[str, Any]) -> AggregationSpec:
    """The :class:`~ghofl.server.plan.AggregationSpec` of aggregation field values, by name.

    The ``dp_*`` fields make its :class:`~ghofl.privacy.DPConfig` (none without
    ``dp_epsilon``; another of them given without it is refused).
    """
    kw = _given("aggregation", values)
    dp = {spec.attr: kw.pop(spec.name) for spec in part_fields("aggregation")
          if spec.within == "dp" and spec.name in kw}
    return AggregationSpec(**kw, dp=_dp_config(dp))


def server_job(values: Mapping[str, Any]) -> ServerJob:
    """The :class:`~ghofl.server.job.ServerJob` of server field values, by field name."""
    from ghofl.server.job import ServerJob  # the server's modules, on first use

    return ServerJob(**_given("server", values))


def _given(part: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The given (not ``None``) values of ``part``'s fields, their choices checked."""
    specs = part_fields(part)
    unknown = sorted(set(values) - {s.name for s in specs})
    if unknown:
        raise ValueError(f"not {part} fields of FIELDS: {unknown}")
    out: dict[str, Any] = {}
    for spec in specs:
        value = values.get(spec.name)
        if value is None:
            if spec.default is REQUIRED:
                raise FieldError(spec.path, _required_text(spec))
            continue
        if spec.choices and value not in spec.choices:
            raise FieldError(spec.path, _choice_text(spec, value))
        out[spec.name] = value
    return out


def _required_text(spec: FieldSpec) -> Callable[[FieldNames], str]:
    return lambda n: f"{n.name(spec.path)} is required ({spec.help})"


def _choice_text(spec: FieldSpec, value: object) -> Callable[[FieldNames], str]:
    return lambda n: (f"{n.name(spec.path)} must be one of {', '.join(spec.choices)}; got "
                      f"{value!r}")


def _dp_config(given: dict[str, Any]) -> DPConfig | None:
    """The :class:`~ghofl.privacy.DPConfig` of the given DP values, by DPConfig attribute."""
    epsilon = given.pop("epsilon", None)
    if epsilon is None:
        if given:
            path = f"aggregation.dp_{next(iter(given))}"
            raise FieldError(path, lambda n: (
                f"{n.name(path)} needs {n.name('aggregation.dp_epsilon')}; give the privacy "
                "budget epsilon"))
        return None
    from ghofl.privacy import DPConfig

    return DPConfig(epsilon, **given)


def cfg_str(cfg: Mapping[str, Any], key: str, default: str = "") -> str:
    """``cfg[key]`` as a string (``default`` when absent)."""
    value: str = config_scalar(cfg.get(key, default), str, key)
    return value


def cfg_int(cfg: Mapping[str, Any], key: str, default: int = 0) -> int:
    """``cfg[key]`` as an integer (``default`` when absent)."""
    value: int = config_scalar(cfg.get(key, default), int, key)
    return value


def cfg_float(cfg: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    """``cfg[key]`` as a number (``default`` when absent)."""
    value: float = config_scalar(cfg.get(key, default), float, key)
    return value
