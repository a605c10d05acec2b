"""Run-config helpers shared by the ClientApp and the ServerApp (no flwr import)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ghofl.client.job import ClientJob
from ghofl.client.transforms import apply_feature_transform
from ghofl.errors import ConfigError
from ghofl.secure.policy import ClientPolicy
from ghofl.server.config import cfg_float, cfg_int, cfg_str
from ghofl.server.fields import FIELDS, check_spellings
from ghofl.server.plan import THREAT_MODEL_DEFAULTS
from ghofl.stats.meta import StatsMeta

__all__ = ["POLICY_KEYS", "cfg_float", "cfg_int", "cfg_str", "job_meta", "node_policy"]


def job_meta(job: ClientJob, input_dim: int | None) -> StatsMeta:
    """The statistics metadata every client of ``job`` produces.

    For embeddings of dimension ``input_dim``, ignored when the job names an encoder
    (its output dimension is used).
    """
    if job.encoder is not None:
        info = job.encoder_info()
        assert info is not None
        return job.stats_meta(info.dim, info)
    if input_dim is None:
        raise ConfigError(
            "the embedding dimension is unknown: set the run config key 'dim' or give a "
            "test set (test-path) so the server knows the statistics' shape"
        )
    info = job.encoder_info(input_dim)
    dim = info.dim if info is not None else apply_feature_transform(
        np.zeros((1, int(input_dim))), job.feature_transform).shape[1]
    return job.stats_meta(int(dim), info)


#: Node config keys of a node's own threat model, by :class:`~ghofl.secure.ClientPolicy`
#: field: the run config's keys of the same parameters (``corrupt_fraction``, ...).
POLICY_KEYS: Mapping[str, str] = {name: FIELDS[f"aggregation.{name}"].key
                                  for name in THREAT_MODEL_DEFAULTS}


def node_policy(node_cfg: Mapping[str, Any], authenticated: bool, *,
                insecure_keys: bool = False) -> ClientPolicy:
    """The node's own :class:`~ghofl.secure.ClientPolicy`, from its node config.

    The keys of :data:`POLICY_KEYS` (absent: the defaults of their fields in FIELDS) are the
    node's, never the server's: the node accepts only rounds at least as strict as they ask
    (a threshold, degree and share threshold no lower than they need).

    Parameters
    ----------
    node_cfg : mapping
        The node config (``flower-supernode --node-config``).
    authenticated : bool
        The node holds a roster.
    insecure_keys : bool, default False
        Without a roster: the node config says ``insecure-keys=true``, so unauthenticated
        rounds are allowed (never without it).

    Raises
    ------
    ConfigError
        A key holds a value out of range, or is spelt with hyphens (``corrupt-fraction``);
        the message names the key.
    """
    check_spellings(node_cfg, "node config",
                    tuple(f"aggregation.{name}" for name in THREAT_MODEL_DEFAULTS))
    values = {}
    for name, key in POLICY_KEYS.items():
        value = node_cfg.get(key, THREAT_MODEL_DEFAULTS[name])
        fraction = name.endswith("fraction")
        number = (isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value))
        if not number or (not 0 <= value < 1 if fraction else value <= 0):
            want = "a fraction in [0, 1)" if fraction else "a number of bits > 0"
            raise ConfigError(f"node config key {key!r} must be {want}; got {value!r}: fix "
                              "it in this SuperNode's --node-config")
        values[name] = float(value)
    return ClientPolicy(corrupt_fraction=values["corrupt_fraction"],
                        dropout_fraction=values["dropout_fraction"], sigma=values["sigma"],
                        eta=values["eta"],
                        allow_unauthenticated=insecure_keys and not authenticated)
