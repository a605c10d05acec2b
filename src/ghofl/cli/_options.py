"""The options of a federation's plan as CLI parameters, generated from the field table.

Every command that sets plan fields takes them from :data:`~ghofl.server.fields.FIELDS`: the
decorators :func:`upload_options` (the client fields with a CLI declaration),
:func:`aggregation_options` and :func:`server_options` give a command one parameter per field
of their part (flag, type, default and ``--help`` from the table) and hand the command's body
their values as one :class:`UploadOptions`, :class:`AggregationOptions` or
:class:`ServerOptions`, which builds the plan's part (:func:`federation` builds the whole
plan). So a new option needs only its declaration in FIELDS, its dataclass field and its use.
A field a command sets in its own way (``--classes``, read from the archives in one command,
a number in another), or the one field of a part a command takes (``aggregate``'s
``--store``), is declared with :func:`field_option`, which takes its flag from FIELDS.
The plan checks the options; its errors name the field, and :func:`cli_plan` renders them
with the flags of FIELDS.

Wiring a command (e.g. ``ghofl fit``, ``ghofl aggregate``)::

    @app.command("fit")
    @server_options()                                        # --heads --param --seed ...
    def fit(stats: ..., *, server: ServerOptions) -> None:
        job = server.job()                                   # the ServerJob, errors by flag

    @app.command("aggregate")
    def aggregate(
        files: ...,
        store: Annotated[Path | None, field_option(          # --store, the command's own help
            "aggregation.store", help="Aggregation store ...")] = None,   # None: no store
    ) -> None: ...

The decorators go below ``@app.command(...)``; the body declares its ``upload``,
``aggregation`` or ``server`` parameter where the options go in its ``--help`` (keyword-only,
e.g. after a bare ``*``). A command keeps its body as ``__wrapped__`` and the selection as
``<param>_exclude`` / ``<param>_only`` (e.g. ``upload_exclude``), so that it can be built
again from FIELDS (tests declaring a field do).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar, cast

import typer

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, FieldError
from ghofl.server.config import aggregation_spec, server_job
from ghofl.server.fields import CLI, FIELDS, FieldSpec, part_fields
from ghofl.server.plan import FederationPlan, check_transport_dtype, default_min_class_count

if TYPE_CHECKING:
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import AggregationSpec

__all__ = [
    "AggregationOptions",
    "FeatureTransformOption",
    "FieldOptions",
    "ParamOption",
    "ServerOptions",
    "UploadOptions",
    "aggregation_options",
    "check_feature_transform_option",
    "cli_plan",
    "federation",
    "field_option",
    "server_options",
    "upload_options",
]

T = TypeVar("T")


def field_option(path: str, *, help: str | None = None) -> Any:
    """The ``typer.Option`` of plan field ``path``: its flag in FIELDS, and its help.

    Parameters
    ----------
    path : str
        A plan field with a flag (``"client.classes"``).
    help : str, optional
        The command's own help (default: the field's generated ``--help`` text).

    Raises
    ------
    ValueError
        The field has no flag, or no help is given for a field without a CLI declaration.
    """
    spec = FIELDS[path]
    if not spec.flag:
        raise ValueError(f"{path} has no CLI flag in FIELDS")
    if help is None:
        if spec.cli is None:
            raise ValueError(f"{path} has no --help text in FIELDS; give the command's own")
        help = spec.cli_help
    off = spec.cli.off_flag if spec.cli is not None else ""
    return typer.Option(f"{spec.flag}/{off}" if spec.switch and off else spec.flag, help=help)


FeatureTransformOption = Annotated[str, field_option("client.feature_transform")]
ParamOption = Annotated[list[str] | None, field_option("server.head_params")]


@dataclass(frozen=True)
class FieldOptions:
    """The generated options of one part of the plan, as one invocation parsed them.

    Attributes
    ----------
    values : mapping of str to object
        The parameter of each option the command takes, by field name (``holdout_fraction``
        for ``--holdout``); ``None``: not given.
    """

    values: Mapping[str, Any]
    part: ClassVar[str] = ""

    def __getitem__(self, name: str) -> Any:
        """The parameter of the option of field ``name`` (``None``: not given)."""
        return self.values[name]

    def given(self) -> dict[str, Any]:
        """The fields' values the options give, by field name (those not given left out).

        A switch gives its field's value with or without it (``"secure"``, ``"plain"``); a
        repeatable option and ``--heads`` are parsed (``--param lda.shrinkage=0.1``).

        Raises
        ------
        ConfigError
            A repeatable option or ``--heads`` is malformed.
        """
        out: dict[str, Any] = {}
        for name, raw in self.values.items():
            spec = FIELDS[f"{self.part}.{name}"]
            value = _field_value(spec, raw, out)
            if value is not None:
                out[name] = value
        return out


class UploadOptions(FieldOptions):
    """The upload options (client fields) of one invocation of a command."""

    part = "client"

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
        return cli_plan(lambda: ClientJob(classes, **{**self.given(), **derived}))

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
        dtype = self.values.get("transport_dtype") or FIELDS["client.transport_dtype"].default
        cli_plan(lambda: check_transport_dtype(dtype, "secure" if secure else "plain"))


class AggregationOptions(FieldOptions):
    """The aggregation options (protocol, secure round, DP, ...) of one invocation."""

    part = "aggregation"

    @property
    def secure(self) -> bool:
        """Whether the options ask for the secure protocol."""
        return bool(self.given().get("protocol") == "secure")

    def spec(self, **derived: Any) -> AggregationSpec:
        """The :class:`~ghofl.server.plan.AggregationSpec` of the options, errors by flag.

        ``derived`` holds fields the command worked out itself; it overrides the options.

        Raises
        ------
        ConfigError
            An option is invalid, or a rule of the aggregation is broken (``--threshold``
            without ``--secure``, ``--dp-delta`` without ``--dp-epsilon``, ...).
        """
        return cli_plan(lambda: aggregation_spec({**self.given(), **derived}))


class ServerOptions(FieldOptions):
    """The server options (heads, hyperparameters, seed, preset) of one invocation."""

    part = "server"

    def job(self, **derived: Any) -> ServerJob:
        """The :class:`~ghofl.server.job.ServerJob` of the options, errors by flag.

        Raises
        ------
        ConfigError
            An unknown head, preset or hyperparameter, or a malformed ``--param``.
        """
        return cli_plan(lambda: server_job({**self.given(), **derived}))


def federation(classes: tuple[str, ...], upload: UploadOptions, aggregation: AggregationSpec,
               server: ServerJob, *, hint: Callable[[FieldError], str] | None = None,
               **derived: Any) -> FederationPlan:
    """The :class:`~ghofl.server.plan.FederationPlan` of a command's options.

    ``aggregation`` and ``server`` are :meth:`AggregationOptions.spec` and
    :meth:`ServerOptions.job` (built first, to check them before any work); ``derived`` holds
    client fields the command worked out itself. Without ``--min-class-count`` the minimum
    count is :func:`~ghofl.server.plan.default_min_class_count` of the plan's DP.

    Raises
    ------
    ConfigError
        An option is invalid or a rule of the plan is broken; the message names the flags
        (``hint``: a sentence from what the command knows).
    """
    if upload.values.get("min_class_count") is None:
        derived.setdefault("min_class_count", default_min_class_count(aggregation.dp))
    client = upload.job(classes, **derived)
    return cli_plan(lambda: FederationPlan(client, aggregation, server), hint)


def _field_value(spec: FieldSpec, raw: Any, given: Mapping[str, Any]) -> Any:
    """The field's value of a parameter (``None``: not given); ``given``: the fields before."""
    if spec.switch:
        return spec.on if raw else spec.off
    if raw is None:
        return None
    parse = _PARSERS.get(spec.path)
    return raw if parse is None else parse(raw, given)


def _heads(raw: str, given: Mapping[str, Any]) -> tuple[str, ...]:
    from ghofl.heads.registry import parse_head_list

    return tuple(parse_head_list(raw))


def _head_params(raw: list[str], given: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    from ghofl.cli.io import parse_param_options

    return parse_param_options(raw, given.get("heads", FIELDS["server.heads"].default))


def _drops(raw: list[str], given: Mapping[str, Any]) -> dict[str, int]:
    from ghofl.secure import parse_drops
    from ghofl.secure.messages import SECURE_STAGES

    return parse_drops(raw, SECURE_STAGES if given.get("protocol") == "secure" else ("input",))


#: The fields whose CLI parameter is parsed into the field's value: (parameter, fields before).
_PARSERS: Mapping[str, Callable[[Any, Mapping[str, Any]], Any]] = {
    "server.heads": _heads, "server.head_params": _head_params, "aggregation.drops": _drops}


def upload_options(*, exclude: tuple[str, ...] = ()
                   ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Give a command every upload option of FIELDS as a parameter (its body's ``upload``).

    Parameters
    ----------
    exclude : tuple of str
        Plan fields (``client.projection_dim``) of upload options the command does not take.
    """
    return _field_options("upload", UploadOptions, exclude, None)


def aggregation_options(*, exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None
                        ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Give a command the aggregation options of FIELDS (its body's ``aggregation``).

    Parameters
    ----------
    exclude : tuple of str
        Plan fields (``aggregation.drops``) the command does not take.
    only : tuple of str, optional
        The plan fields the command takes (default: every one not excluded).
    """
    return _field_options("aggregation", AggregationOptions, exclude, only)


def server_options(*, exclude: tuple[str, ...] = (), only: tuple[str, ...] | None = None
                   ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Give a command the server options of FIELDS (its body's ``server``).

    Parameters
    ----------
    exclude, only : tuple of str
        As for :func:`aggregation_options`.
    """
    return _field_options("server", ServerOptions, exclude, only)


def _field_options(param: str, options: type[FieldOptions], exclude: tuple[str, ...],
                   only: tuple[str, ...] | None
                   ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """The decorator of one part's options: the body's ``param`` becomes one per field."""
    known = {f.path for f in part_fields(options.part) if f.cli is not None}
    unknown = sorted((set(exclude) | set(only or ())) - known)
    if unknown:
        raise ValueError(f"not {param} options: {unknown}; known: {sorted(known)}")

    def decorate(body: Callable[..., T]) -> Callable[..., T]:
        specs = [f for f in part_fields(options.part) if f.cli is not None
                 and f.path not in exclude and (only is None or f.path in only)]
        signature = inspect.signature(body, eval_str=True)
        if param not in signature.parameters:
            raise TypeError(f"{body.__name__} declares no parameter '{param}: "
                            f"{options.__name__}'")
        params = [q.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in signature.parameters.values()
                  for q in ([_parameter(f) for f in specs] if p.name == param else [p])]

        @functools.wraps(body)
        def command(**kwargs: Any) -> T:
            given = options({f.name: kwargs.pop(f.name) for f in specs})
            return body(**kwargs, **{param: given})

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        setattr(command, f"{param}_exclude", exclude)
        setattr(command, f"{param}_only", only)
        return command

    return decorate


def _parameter(spec: FieldSpec) -> inspect.Parameter:
    """The typer parameter of one field, named as its dataclass field."""
    assert spec.cli is not None
    if spec.switch:
        tp: Any = bool
    elif spec.cli.repeat:
        tp = list[str] | None
    else:
        tp = spec.scalar if spec.cli_default is not None else spec.scalar | None
    annotation = cast(Any, Annotated)[tp, field_option(spec.path)]
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=spec.cli_default,
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


FederatedEvalOption = Annotated[bool, typer.Option(
    "--federated-eval", help="Every client holds out a seeded fraction of its rows, scores the "
    "fitted heads on them and sends only sums; report the federated metrics too.")]
EvalFractionOption = Annotated[float | None, typer.Option(
    "--eval-fraction", help="Fraction of its rows each client holds out with "
    "--federated-eval (default 0.2); its statistics come from the rest.")]

#: Fraction of its rows a client holds out under --federated-eval when none is given.
DEFAULT_EVAL_FRACTION = 0.2


def eval_fraction_of(federated_eval: bool, eval_fraction: float | None) -> float:
    """The fraction each client holds out (0.0 without --federated-eval)."""
    if not federated_eval:
        if eval_fraction is not None:
            raise ConfigError("--eval-fraction applies with --federated-eval only; add "
                              "--federated-eval or drop --eval-fraction")
        return 0.0
    fraction = DEFAULT_EVAL_FRACTION if eval_fraction is None else eval_fraction
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--eval-fraction must be between 0 and 1 (e.g. 0.2); got {fraction:g}")
    return fraction
