"""Run-config helpers shared by the ClientApp and the ServerApp (no flwr import)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ghofl.client.job import ClientJob
from ghofl.client.transforms import apply_feature_transform
from ghofl.errors import ConfigError
from ghofl.server.config import cfg_float, cfg_int, cfg_str
from ghofl.server.plan import default_min_class_count
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:
    from ghofl.privacy import NoisePlan

__all__ = ["cfg_float", "cfg_int", "cfg_str", "dp_options", "job_meta"]


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


def dp_options(cfg: Mapping[str, Any], job: ClientJob) -> tuple[ClientJob, NoisePlan | None]:
    """The job the client runs and the calibrated DP plan (or None), from the run config.

    The DP keys are ``dp-epsilon`` (0 = no DP), ``dp-delta``, ``dp-mode`` (``central`` or
    ``distributed``) and ``min-class-count`` (0 = the default: 5 with DP, 1 without).
    The returned job has its minimum count set: 1 under DP, where the server applies
    the rule to the noised counts.
    """
    from ghofl.privacy import DEFAULT_DELTA, DPConfig, plan_noise

    eps = cfg_float(cfg, "dp-epsilon", 0.0)
    k = cfg_int(cfg, "min-class-count", 0)
    if k < 0:
        raise ConfigError(f"run config key 'min-class-count' must be >= 0; got {k}")
    config = None if eps == 0.0 else DPConfig(
        eps, cfg_float(cfg, "dp-delta", DEFAULT_DELTA),
        cfg_str(cfg, "dp-mode", "central"))  # type: ignore[arg-type]
    k = k or (default_min_class_count(config) if config is not None else job.min_class_count)
    if config is None:
        return replace(job, min_class_count=k), None
    # under DP the server applies the rule to the noised counts; the clients keep every class
    return replace(job, min_class_count=1), plan_noise(config, job.mode, job.clip_norm, k)
