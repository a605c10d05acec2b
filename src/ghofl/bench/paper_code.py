"""The GH-OFL paper's own code, imported from a checkout the user names, and its stage verdicts.

The paper (Turazza, Picone, Mamei, ICLR 2026) released its code as research scripts
(:data:`PAPER_URL`): a client script (:data:`CLIENT_SCRIPT`) that accumulates the class
statistics of backbone features, and a server (:data:`SERVER_SCRIPT`) that aggregates them and
fits naive Bayes, LDA, QDA, FisherMix and Proto-Hyper. ghofl never copies that code: a
benchmark reads it from the checkout the user gives (:func:`check_paper_repo`) and imports the
two files unmodified (:func:`load_paper_code`). Both import torchvision (data sets,
transforms) and the repository's ``models`` package (ImageNet backbones) at module level; the
benchmark feeds them features already computed, so those imports are replaced by empty stub
modules while the two files load (:func:`stubbed_imports`) and restored afterwards.

:func:`server_settings` reads the server's hyperparameters from one of the repository's YAML
configs with the server's own defaults for the keys it omits. :func:`stage_verdicts` judges
the measured stages against the targets of issue 40.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ghofl.errors import GhoflError

__all__ = ["CLIENT_SCRIPT", "CONFIG", "DEFAULT_FIT_TARGET", "PAPER_URL", "SERVER_DEFAULTS",
           "SERVER_SCRIPT", "STUBBED_MODULES", "PaperCode", "PaperCodeError", "check_paper_repo",
           "load_paper_code", "server_settings", "stage_verdicts", "stubbed_imports"]

PAPER_URL = "https://github.com/FabioTur-dev/One-Shot-FL"
CLIENT_SCRIPT = "client/run_client_backbones.py"
SERVER_SCRIPT = "server/GH_OFL_server.py"
#: The paper's configuration for CIFAR-10, relative to the checkout.
CONFIG = "configs/cifar10.yaml"
#: Modules the two scripts import that the benchmark replaces by stubs (no images, no
#: backbone: the features are given).
STUBBED_MODULES = ("torchvision", "torchvision.datasets", "torchvision.transforms",
                   "torchvision.models", "models")
#: The server's default for every hyperparameter it reads from its YAML config (the values
#: of its ``main``), plus the client's batch size (its ``main``'s default).
SERVER_DEFAULTS: dict[str, Any] = {
    "seed": 123, "test_batch": 256, "lda_shrink": 0.05, "qda_shrink": 0.05,
    "fisher_energy": 0.99, "fisher_max_dim": 128, "syn_ns_per_class": 10000,
    "syn_shrink": 0.0, "syn_tau_base": 0.75, "syn_tau_clip": (0.60, 1.40),
    "syn_use_class_cov": True, "fm_epochs": 80, "fm_batch": 2048, "fm_lr": 8e-4,
    "fm_wd": 3e-4, "ph_epochs": 20, "ph_batch": 1024, "ph_lr": 1e-3, "ph_wd": 5e-4,
    "ph_rank": 128, "kd_alpha": 0.85, "kd_T": 4.0, "teacher_blend": 0.7, "batch_size": 512,
}
#: Most a fit at ghofl's default (data-driven shrinkage) may cost, in multiples of the same
#: head's fit at the paper's fixed coefficients (issue 40).
DEFAULT_FIT_TARGET = 2.0


class PaperCodeError(GhoflError, ValueError):
    """The paper's checkout is missing, incomplete or cannot be imported."""


@dataclass(frozen=True)
class PaperCode:
    """The paper's two scripts, imported.

    Attributes
    ----------
    client, server : module
        ``client/run_client_backbones.py`` and ``server/GH_OFL_server.py``.
    repo : Path
        The checkout they were read from.
    commit : str or None
        Its ``HEAD`` commit, when the checkout is a git work tree.
    """

    client: types.ModuleType
    server: types.ModuleType
    repo: Path
    commit: str | None


def _how_to_get(flag: str) -> str:
    return (f"clone the paper's code (git clone {PAPER_URL} /path/to/One-Shot-FL) and pass "
            f"{flag} /path/to/One-Shot-FL; ghofl does not ship or download it")


def check_paper_repo(path: str | Path | None, flag: str = "--paper-repo") -> Path:
    """The checkout of the paper's code at ``path``, with both scripts and the config present.

    Parameters
    ----------
    path : path or None
        What the user gave (``None``: nothing).
    flag : str
        The option that names it, for the message.

    Raises
    ------
    PaperCodeError
        Nothing given, or a file the benchmark reads is missing: one sentence saying how to
        get the checkout.
    """
    if path is None:
        raise PaperCodeError(f"No checkout of the paper's code was given: {_how_to_get(flag)}.")
    root = Path(path).expanduser()
    missing = [f for f in (CLIENT_SCRIPT, SERVER_SCRIPT, CONFIG) if not (root / f).is_file()]
    if missing:
        raise PaperCodeError(
            f"{root} is not a checkout of the paper's code ({', '.join(missing)} missing): "
            f"{_how_to_get(flag)}."
        )
    return root.resolve()


@contextmanager
def stubbed_imports() -> Iterator[None]:
    """A block in which :data:`STUBBED_MODULES` import as empty stubs.

    ``models.build_backbone`` raises when called (the benchmark gives features, never
    images). Whatever ``sys.modules`` held under those names before is put back on exit.
    """
    saved = {name: sys.modules.get(name) for name in STUBBED_MODULES}

    def no_backbone(*_args: object, **_kwargs: object) -> None:
        raise PaperCodeError("the paper's backbone is stubbed: the benchmark gives features")

    stubs = {name: types.ModuleType(name) for name in STUBBED_MODULES}
    for name in ("datasets", "transforms", "models"):
        setattr(stubs["torchvision"], name, stubs[f"torchvision.{name}"])
    stubs["models"].build_backbone = no_backbone  # type: ignore[attr-defined]
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _import_file(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        raise PaperCodeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered while it runs (its dataclasses look it up)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        del sys.modules[name]
        raise PaperCodeError(
            f"importing {path} failed ({exc}); the paper's code needs torch and PyYAML "
            "(pip install torch pyyaml)"
        ) from None
    return module


def _commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def load_paper_code(path: str | Path | None, flag: str = "--paper-repo") -> PaperCode:
    """Import the paper's client script and server from the checkout at ``path``, unmodified.

    Raises
    ------
    PaperCodeError
        See :func:`check_paper_repo`; or torch or PyYAML is not installed.
    """
    repo = check_paper_repo(path, flag)
    with stubbed_imports():
        client = _import_file(repo / CLIENT_SCRIPT, "_ghofl_paper_client")
        server = _import_file(repo / SERVER_SCRIPT, "_ghofl_paper_server")
    return PaperCode(client=client, server=server, repo=repo, commit=_commit(repo))


def server_settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The server's hyperparameters: :data:`SERVER_DEFAULTS` overridden by ``config``.

    Parameters
    ----------
    config : mapping or None
        A YAML config of the paper's repository, as read (keys the server does not read are
        ignored).

    Returns
    -------
    dict
        Every key of :data:`SERVER_DEFAULTS`, with the type of its default
        (``syn_tau_clip`` a pair of floats).
    """
    given = dict(config or {})
    out: dict[str, Any] = {}
    for key, default in SERVER_DEFAULTS.items():
        value = given.get(key, default)
        if isinstance(default, tuple):
            out[key] = tuple(float(v) for v in value)
        elif isinstance(default, bool):
            out[key] = bool(value)
        else:
            out[key] = type(default)(value)
    return out


def stage_verdicts(stage: str, times: Mapping[str, float | None]) -> dict[str, Any]:
    """Ratios and verdicts of one stage against the targets of issue 40.

    Parameters
    ----------
    stage : str
        ``client_stats``, ``aggregation``, ``fit_<head>`` or ``eval_<head>``.
    times : mapping
        Median seconds: ``paper`` (``None`` when the paper's code has no such stage),
        ``ghofl_paper`` (ghofl at ``preset="paper"``; for stages without hyperparameters
        simply ghofl) and ``ghofl_default`` (``None`` when it is the same run).

    Returns
    -------
    dict
        ``ratio_paper`` (ghofl at the paper's preset / paper) and ``verdict_paper``: met when
        at most 1; ``ratio_default`` and ``verdict_default``: for a fit, ghofl's default /
        ghofl at the paper's preset, met when at most :data:`DEFAULT_FIT_TARGET`; for any
        other stage, ghofl's default / paper, met when at most 1. A ratio without both
        times is ``None`` and its verdict ``"n/a"``.
    """
    paper, fixed, default = times.get("paper"), times.get("ghofl_paper"), times.get(
        "ghofl_default")
    is_fit = stage.startswith("fit_")

    def judge(num: float | None, den: float | None, bound: float) -> tuple[float | None, str]:
        if num is None or den is None or den <= 0:
            return None, "n/a"
        r = num / den
        return r, "met" if r <= bound else "NOT met"

    out: dict[str, Any] = {}
    out["ratio_paper"], out["verdict_paper"] = judge(fixed, paper, 1.0)
    if is_fit:
        out["ratio_default"], out["verdict_default"] = judge(default, fixed, DEFAULT_FIT_TARGET)
    else:
        out["ratio_default"], out["verdict_default"] = judge(default, paper, 1.0)
    return out
