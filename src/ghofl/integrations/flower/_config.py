"""Run-config helpers shared by the ClientApp and the ServerApp (no flwr import)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ghofl.client.job import ClientJob
from ghofl.client.transforms import apply_feature_transform
from ghofl.errors import ConfigError
from ghofl.stats.meta import StatsMeta

__all__ = ["cfg_float", "cfg_int", "cfg_str", "job_meta"]


def job_meta(job: ClientJob, input_dim: int | None) -> StatsMeta:
    """The statistics metadata every client of ``job`` produces from embeddings of dimension
    ``input_dim`` (ignored when the job names an encoder: its output dimension is used)."""
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


def cfg_str(cfg: Mapping[str, Any], key: str, default: str = "") -> str:
    value = cfg.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"run config key {key!r} must be a string; got {value!r}")
    return value


def cfg_int(cfg: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"run config key {key!r} must be an integer; got {value!r}")
    return int(value)


def cfg_float(cfg: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"run config key {key!r} must be a number; got {value!r}")
    return float(value)
