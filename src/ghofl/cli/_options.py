"""Options shared by several subcommands, declared once, and their checks.

The upload options (:func:`~ghofl.server.fields.upload_fields`: the client fields of
:data:`~ghofl.server.fields.FIELDS` with a CLI declaration) are generated: the decorator
:func:`upload_options` gives a command one parameter per option (flag, default and help from
FIELDS) and hands the command's body their values as one :class:`UploadOptions`, which builds
the :class:`~ghofl.client.job.ClientJob`. The other shared options are annotated types for a
typer parameter, e.g. ``preset: PresetOption = "default"``; the default stays in the signature.
The client job and the plan check the options; their errors name the field, and
:func:`cli_plan` renders them with the flags of FIELDS.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

import typer

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, FieldError
from ghofl.server.fields import CLI, FIELDS, FieldSpec, upload_fields
from ghofl.server.plan import check_transport_dtype

__all__ = [
    "FeatureTransformOption",
    "ParamOption",
    "PresetOption",
    "UploadOptions",
    "check_feature_transform_option",
    "cli_plan",
    "field_option",
    "upload_options",
]

T = TypeVar("T")


def field_option(path: str) -> Any:
    """The ``typer.Option`` of the upload option ``path``: its flag and help in FIELDS."""
    spec = FIELDS[path]
    if spec.cli is None:
        raise ValueError(f"{path} is not an upload option (its FieldSpec has no cli)")
    return typer.Option(spec.flag, help=spec.cli.help)


FeatureTransformOption = Annotated[str, field_option("client.feature_transform")]
ParamOption = Annotated[list[str] | None, typer.Option(
    "--param", help="Head hyperparameter HEAD.KEY=VALUE (repeatable), e.g. "
    "lda.shrinkage=auto.")]
PresetOption = Annotated[str, typer.Option(
    "--preset", help="Named head hyperparameters: 'default' (chosen from the data) or "
    "'paper' (the paper's fixed values); --param overrides them.")]


@dataclass(frozen=True)
class UploadOptions:
    """The upload options of one invocation of a command, by ClientJob field.

    Attributes
    ----------
    values : mapping of str to object
        The value of each upload option the command takes, by field name (``holdout_fraction``
        for ``--holdout``); ``None``: not given.
    """

    values: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        """The value of the option of ClientJob field ``name`` (``None``: not given)."""
        return self.values[name]

    def job(self, classes: tuple[str, ...], **derived: Any) -> ClientJob:
        """The :class:`ClientJob` of the options, its errors naming the CLI flags.

        An option not given takes the ClientJob's default; ``derived`` holds what the command
        worked out itself (e.g. the fingerprint of ``--projection-basis default``) and
        overrides the options.

        Raises
        ------
        ConfigError
            An option is invalid; the message names its flag (e.g. ``--holdout``).
        """
        given = {k: v for k, v in self.values.items() if v is not None}
        return cli_plan(lambda: ClientJob(classes, **{**given, **derived}))

    def check(self, *, secure: bool = False, skip: tuple[str, ...] = ()) -> None:
        """Check the options before any work, as :meth:`job` does.

        Also checks float32 transport against ``--secure``.

        Parameters
        ----------
        secure : bool, default False
            The command runs the secure protocol.
        skip : tuple of str
            Fields the command derives before its job (checked then), e.g.
            ``projection_basis``, which may be ``default``.

        Raises
        ------
        ConfigError
            A value is invalid, or float32 transport is asked of the secure protocol.
        """
        UploadOptions({k: v for k, v in self.values.items() if k not in skip}).job(("0",))
        dtype = self.values.get("transport_dtype") or "float64"
        cli_plan(lambda: check_transport_dtype(dtype, "secure" if secure else "plain"))


def upload_options(*, exclude: tuple[str, ...] = ()
                   ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Give a command every upload option of FIELDS as a parameter.

    The decorated body declares a parameter ``upload: UploadOptions`` where the options go in
    its ``--help`` (keyword-only, e.g. after a bare ``*``); the command takes, in its place,
    one parameter per option of :func:`~ghofl.server.fields.upload_fields` (flag, default and
    help from :data:`~ghofl.server.fields.FIELDS`) and calls the body with their values as
    one :class:`UploadOptions`. Put it below ``@app.command(...)``. The command keeps the body
    as ``__wrapped__`` and ``exclude`` as ``upload_exclude``, so that it can be built again
    (tests declaring a field do).

    Parameters
    ----------
    exclude : tuple of str
        Plan fields (``client.projection_dim``) of upload options the command does not take.
    """
    known = {f.path for f in upload_fields()}
    unknown = sorted(set(exclude) - known)
    if unknown:
        raise ValueError(f"not upload options: {unknown}; known: {sorted(known)}")

    def decorate(body: Callable[..., T]) -> Callable[..., T]:
        specs = [f for f in upload_fields() if f.path not in exclude]
        signature = inspect.signature(body, eval_str=True)
        if "upload" not in signature.parameters:
            raise TypeError(f"{body.__name__} declares no parameter 'upload: UploadOptions'")
        params = [q.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in signature.parameters.values()
                  for q in ([_parameter(f) for f in specs] if p.name == "upload" else [p])]

        @functools.wraps(body)
        def command(**kwargs: Any) -> T:
            upload = UploadOptions({f.name: kwargs.pop(f.name) for f in specs})
            return body(**kwargs, upload=upload)

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.upload_exclude = exclude  # type: ignore[attr-defined]
        return command

    return decorate


def _parameter(spec: FieldSpec) -> inspect.Parameter:
    """The typer parameter of one upload option, named as its ClientJob field."""
    assert spec.cli is not None
    annotation = cast(Any, Annotated)[spec.python_type, field_option(spec.path)]
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=spec.cli.default,
                             annotation=annotation)


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
