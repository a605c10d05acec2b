"""Options shared by several subcommands, declared once, and their checks.

Each ``*Option`` is an annotated type for a typer parameter, e.g.
``holdout: HoldoutOption = 0.0``; the default stays in the signature. The client-side upload
options (--holdout, --holdout-seed, --transport-dtype) are checked by
:class:`~ghofl.client.job.ClientJob`; its errors name the field, and :func:`cli_plan` renders
them with the flags of :data:`~ghofl.server.fields.FIELDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, FieldError
from ghofl.server.fields import CLI
from ghofl.server.plan import check_transport_dtype
from ghofl.stats.meta import Mode

__all__ = [
    "FeatureTransformOption",
    "HoldoutOption",
    "HoldoutSeedOption",
    "ParamOption",
    "PresetOption",
    "TransportDtypeOption",
    "check_feature_transform_option",
    "check_upload_options",
    "cli_plan",
    "client_job",
]

HoldoutOption = Annotated[float, typer.Option(
    "--holdout", help="Each client also uploads the sums of a held-out fraction F in (0, 0.5] "
    "of its samples (seeded per-sample split), so the server can choose hyperparameters on "
    "held-out moments; every client must use the same F. 0: none.")]
HoldoutSeedOption = Annotated[int, typer.Option(
    "--holdout-seed", help="Seed of the held-out split (every client the same).")]
TransportDtypeOption = Annotated[str, typer.Option(
    "--transport-dtype", help="Dtype of the float sums of the plain uploads: float64, or "
    "float32 (half the bytes; the server still adds them in float64).")]
FeatureTransformOption = Annotated[str, typer.Option(
    "--feature-transform", help="Transform of the embeddings before the statistics: none, "
    "sqrt, x+sqrt (appends sqrt(max(x, 0)): doubles d; in pooled mode the linear heads then "
    "reach the centralised probe), or x+sqrt+rbf:FINGERPRINT (x+sqrt, then Gaussian-kernel "
    "similarities to the public anchors of the kernel map that ghofl feature-map built: "
    "kernel heads from one upload). Every client must use the same; the test embeddings get "
    "it too.")]
ParamOption = Annotated[list[str] | None, typer.Option(
    "--param", help="Head hyperparameter HEAD.KEY=VALUE (repeatable), e.g. "
    "lda.shrinkage=auto.")]
PresetOption = Annotated[str, typer.Option(
    "--preset", help="Named head hyperparameters: 'default' (chosen from the data) or "
    "'paper' (the paper's fixed values); --param overrides them.")]

T = TypeVar("T")

def client_job(names: tuple[str, ...], mode: Mode, **options: Any) -> ClientJob:
    """The :class:`ClientJob` of the options, its errors naming the CLI flags.

    Raises
    ------
    ConfigError
        An option is invalid; the message names its flag (e.g. ``--holdout``).
    """
    return cli_plan(lambda: ClientJob(names, mode, **options))


def check_upload_options(holdout: float, holdout_seed: int, transport_dtype: str, *,
                         secure: bool = False) -> None:
    """Check --holdout, --holdout-seed and --transport-dtype before any work.

    As :func:`client_job` does, with their combination with --secure.

    Raises
    ------
    ConfigError
        A value is invalid, or float32 transport is asked of the secure protocol.
    """
    client_job(("0",), "full", holdout_fraction=holdout, holdout_seed=holdout_seed,
               transport_dtype=transport_dtype)
    cli_plan(lambda: check_transport_dtype(transport_dtype, "secure" if secure else "plain"))


def cli_plan(make: Callable[[], T], hint: Callable[[FieldError], str] | None = None) -> T:
    """``make()`` with an invalid option reported in the CLI's flags.

    ``make`` builds a :class:`~ghofl.server.plan.FederationPlan` or one of its
    parts, or checks one of its rules.

    Parameters
    ----------
    make : callable
    hint : callable, optional
        A sentence for the error from what the command knows (e.g. the data's largest norm).

    Raises
    ------
    ConfigError
        The plan's error, rendered for the CLI (:data:`~ghofl.server.fields.CLI`).
    """
    try:
        return make()
    except FieldError as exc:
        raise ConfigError(exc.render(CLI, hint(exc) if hint else "")) from None




def check_feature_transform_option(name: str) -> str:
    """Check --feature-transform before any work.

    Raises
    ------
    ConfigError
        ``name`` is not a known transform.
    """
    from ghofl.client.transforms import check_feature_transform

    return cli_plan(lambda: check_feature_transform(name))
