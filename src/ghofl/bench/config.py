"""Experiment configuration: a TOML file describing a grid of one-shot federations.

Example (every key except ``datasets`` has a default)::

    name = "cifar10-main"
    datasets = ["cifar10"]               # names (cifar10, trec, sst2, agnews) or ImageFolder paths
    encoders = ["efficientnet-lite0"]    # see ghofl.client.encoders.get_encoder
    resolution = 224
    backend = "onnx"                      # or "torch"
    feature_transform = "none"            # or "sqrt", "x+sqrt" (see ghofl.client.transforms)
    alphas = [0.05, 0.1, 0.5]
    clients = [10, 50, 100]
    seeds = [0, 1, 2]
    heads = ["nb", "lda", "qda", "fedcgs", "fishermix", "protohyper"]
    modes = ["full"]
    projection_dims = [0]                 # 0 = no projection
    projection_seed = 0
    train_per_class = 0                   # 0 = the whole split; else a stratified subsample
    test_per_class = 0
    references = ["logreg", "sklearn_lda"]
    secure = false                        # true: the secure aggregation protocol
    clip = 0.0                            # per-sample L2 bound R; 0 = none, or the encoder's
                                          # default R when secure = true

    [head_params.fishermix]
    epochs = 40
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ghofl.errors import ConfigError
from ghofl.heads.registry import available_heads
from ghofl.stats.schema import SCHEMAS

REFERENCES = ("logreg", "sklearn_lda")
#: keys holding lists; every one but ``references`` must be non-empty
_LIST_KEYS = (
    "datasets",
    "encoders",
    "alphas",
    "clients",
    "seeds",
    "heads",
    "modes",
    "projection_dims",
    "references",
)


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment grid (see module docstring for the TOML keys)."""

    datasets: tuple[str, ...]
    name: str = "experiment"
    encoders: tuple[str, ...] = ("efficientnet-lite0",)
    resolution: int = 224
    backend: str = "onnx"
    feature_transform: str = "none"
    alphas: tuple[float, ...] = (0.1,)
    clients: tuple[int, ...] = (10,)
    seeds: tuple[int, ...] = (0,)
    heads: tuple[str, ...] = ("nb", "lda", "qda", "fedcgs", "fishermix", "protohyper")
    modes: tuple[str, ...] = ("full",)
    projection_dims: tuple[int, ...] = (0,)
    projection_seed: int = 0
    train_per_class: int = 0
    test_per_class: int = 0
    min_per_client: int = 0
    references: tuple[str, ...] = REFERENCES
    head_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    data_dir: str | None = None
    secure: bool = False
    clip: float = 0.0

    def __post_init__(self) -> None:
        _nonempty(self, *(k for k in _LIST_KEYS if k != "references"))
        for a in self.alphas:
            if not a > 0:
                raise ConfigError(f"alphas must be positive numbers; got {a}")
        for k in self.clients:
            if int(k) < 1:
                raise ConfigError(f"clients must be integers >= 1; got {k}")
        known = available_heads()
        for h in self.heads:
            if h not in known:
                raise ConfigError(
                    f"unknown head {h!r} in 'heads'; available heads: {', '.join(known)}"
                )
        for h in self.head_params:
            if h not in known:
                raise ConfigError(
                    f"[head_params.{h}] names an unknown head; available heads: {', '.join(known)}"
                )
        for m in self.modes:
            if m not in SCHEMAS:
                raise ConfigError(f"modes must be among {', '.join(SCHEMAS)}; got {m!r}")
        if not isinstance(self.secure, bool):
            raise ConfigError(f"secure must be true or false; got {self.secure!r}")
        if (isinstance(self.clip, bool) or not isinstance(self.clip, int | float)
                or not self.clip >= 0 or self.clip == float("inf")):
            raise ConfigError(
                f"clip must be a finite number >= 0 (0 = no clipping); got {self.clip!r}"
            )
        for p in self.projection_dims:
            if int(p) < 0:
                raise ConfigError(f"projection_dims must be >= 0 (0 = none); got {p}")
        for r in self.references:
            if r not in REFERENCES:
                raise ConfigError(f"unknown reference {r!r}; choose among {', '.join(REFERENCES)}")
        from ghofl.client.transforms import check_feature_transform

        check_feature_transform(self.feature_transform)
        if self.backend not in ("onnx", "torch"):
            raise ConfigError(f"backend must be 'onnx' or 'torch'; got {self.backend!r}")
        if self.resolution < 16:
            raise ConfigError(f"resolution must be >= 16 pixels; got {self.resolution}")
        if self.train_per_class < 0 or self.test_per_class < 0:
            raise ConfigError("train_per_class and test_per_class must be >= 0 (0 = all)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def n_cells(self) -> int:
        """Number of federations the grid runs."""
        n = 1
        for v in (
            self.datasets,
            self.encoders,
            self.modes,
            self.projection_dims,
            self.alphas,
            self.clients,
            self.seeds,
        ):
            n *= len(v)
        return n


def _nonempty(cfg: ExperimentConfig, *names: str) -> None:
    for n in names:
        if not getattr(cfg, n):
            raise ConfigError(f"experiment key {n!r} must be a non-empty list")


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> ExperimentConfig:
    """Build a config from parsed TOML, with errors naming unknown keys and wrong types."""
    fields = set(ExperimentConfig.__dataclass_fields__)
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    if "datasets" not in data:
        raise ConfigError(
            f"{source}: the key 'datasets' is required (e.g. datasets = [\"cifar10\"])"
        )
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key in _LIST_KEYS:
            items = value if isinstance(value, list | tuple) else [value]
            conv = {"alphas": float, "clients": int, "seeds": int, "projection_dims": int}.get(
                key, str
            )
            try:
                kw[key] = tuple(conv(v) for v in items)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{source}: {key} must be a list of {conv.__name__}; got {value!r}"
                ) from None
        elif key == "head_params":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(
                    f"{source}: head_params must be tables like [head_params.fishermix]"
                )
            kw[key] = {k: dict(v) for k, v in value.items()}
        else:
            kw[key] = value
    try:
        return ExperimentConfig(**kw)
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"experiment config {str(p)!r} does not exist; check the path")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{str(p)!r} is not valid TOML: {exc}") from None
    return config_from_dict(data, str(p))
