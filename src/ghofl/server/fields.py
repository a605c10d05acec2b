"""Every option of a federation, declared once: its plan field, type, default, key, flag and help.

A front end names an option in its own vocabulary: the CLI by flag (``--transport-dtype``), a
TOML or Flower run config by key (``transport_dtype``), the library by plan field
(``client.transport_dtype``). :data:`FIELDS` is the one table of those names and of each
option's Python type and default value; :class:`Naming` renders a field, or a setting of it,
for one vocabulary, so that an error of the plan (:class:`~ghofl.server.plan.PlanError`) reads
right in each front end without any editing of its text. :func:`key_table` renders the table
for the docs.

Every default is written once. The client fields read theirs (and their types) from
:class:`~ghofl.client.job.ClientJob`, the secure round's from
:class:`~ghofl.secure.SecAggConfig` and the differential-privacy fields' from
:class:`~ghofl.privacy.DPConfig` (lower layers, which cannot import this module); the other
aggregation and server fields declare theirs here, and
:class:`~ghofl.server.plan.AggregationSpec` and :class:`~ghofl.server.job.ServerJob` take them
from this table. A default of ``None`` means "derived" (what
:attr:`FieldSpec.unset` says), and travels in a run config as the empty string or 0.

The run config (:func:`ghofl.server.config.plan_from_config`, ``plan_to_config``), the plan's
summary (:meth:`~ghofl.server.plan.FederationPlan.describe`) and the CLI parameters of every
command that sets plan fields (:mod:`ghofl.cli._options`) are generated from this table: a new
option needs its :class:`FieldSpec` here, its dataclass field and its use.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, LibraryNames
from ghofl.heads.presets import DEFAULT_PRESET
from ghofl.privacy.mechanism import DPConfig
from ghofl.secure.config import SecAggConfig

__all__ = ["CLI", "CONFIG", "FIELDS", "LIBRARY", "REQUIRED", "CliOption", "Codec", "ConfigValue",
           "FieldSpec", "Naming", "check_spellings", "config_scalar", "key_table",
           "part_fields", "upload_fields"]

#: A value of a flat run config (a TOML table or a Flower ``ConfigRecord`` holds these).
ConfigValue = str | int | float | bool


class _Required:
    """The default of a field without one (``client.classes``)."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: The :attr:`FieldSpec.default` of a field every plan must give.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class CliOption:
    """How a field is a generated parameter of the commands that set it.

    Attributes
    ----------
    help : str
        Its ``--help`` text, the same in every command.
    unset : bool, default False
        The parameter defaults to ``None`` ("not given"; the plan then takes the field's
        default) instead of the field's default: for a field a command checks against others
        (``--projection-seed`` needs ``--projection-dim``, ``--dp-delta`` needs
        ``--dp-epsilon``). The default is then told in the help.
    repeat : bool, default False
        A repeatable option (``list[str]``), e.g. ``--param HEAD.KEY=VALUE``.
    off_flag : str, default ""
        For a switch: the flag that sets the value without it (``--plain``).
    """

    help: str
    unset: bool = False
    repeat: bool = False
    off_flag: str = ""


@dataclass(frozen=True)
class Codec:
    """How a non-scalar field travels in a run config (a string).

    Attributes
    ----------
    encode : callable
        The field's value -> its config string.
    decode : callable
        ``(raw config value, key) -> value``; raises :class:`~ghofl.errors.ConfigError`
        naming the key.
    """

    encode: Callable[[Any], str]
    decode: Callable[[Any, str], Any]


@dataclass(frozen=True)
class FieldSpec:
    """One option of a federation.

    Attributes
    ----------
    path : str
        Plan field, ``"<part>.<name>"`` with part ``client``, ``aggregation`` or ``server``.
    key : str
        Key in a TOML or Flower run config (``""``: none, e.g. the simulated drops).
    flag : str
        CLI flag (``""``: the CLI has none).
    type : object
        The field's Python type (e.g. ``int | None``, ``tuple[str, ...]``).
    default : object
        The field's default value (:data:`REQUIRED`: none; ``None``: derived, see ``unset``).
    help : str
        One line for the docs' key table.
    unset : str, default ""
        What ``None`` means (``"none"``, ``"5 with DP, else 1"``): the docs say it of the
        config's empty string or 0.
    metavar : str, default ""
        What the flag takes, for messages asking for it (``"R"`` in ``--clip R``).
    switch : bool, default False
        A CLI switch that stands for the value ``on`` of the field (``--secure`` for
        ``protocol = "secure"``); ``off`` is the value it stands against.
    on, off : object
        With ``switch``: the field's value with and without the switch.
    cli : CliOption or None, default None
        The field is a generated parameter of the commands that set it (:mod:`ghofl.cli._options`).
    codec : Codec or None, default None
        For a non-scalar field: how it travels in a run config.
    choices : tuple of str, default ()
        The values a string field takes, checked when the plan is built.
    secure_only : bool, default False
        Only the secure protocol takes another value than the default.
    within : str, default ""
        ``"dp"``: the field is the attribute ``name[3:]`` of the aggregation's
        :class:`~ghofl.privacy.DPConfig` (``dp_epsilon`` is ``dp.epsilon``; no DP: ``None``).
    """

    path: str
    key: str
    flag: str
    type: Any
    default: Any
    help: str
    unset: str = ""
    metavar: str = ""
    switch: bool = False
    on: Any = None
    off: Any = None
    cli: CliOption | None = None
    codec: Codec | None = None
    choices: tuple[str, ...] = ()
    secure_only: bool = False
    within: str = ""

    @property
    def part(self) -> str:
        """``client``, ``aggregation`` or ``server``."""
        return self.path.partition(".")[0]

    @property
    def name(self) -> str:
        """The field's name in its part (``clip_norm`` of ``client.clip_norm``)."""
        return self.path.partition(".")[2]

    @property
    def attr(self) -> str:
        """The attribute that holds the field (``epsilon`` of ``dp_epsilon``)."""
        return self.name[3:] if self.within == "dp" else self.name

    @property
    def scalar(self) -> type:
        """The type of the field's value in a run config and on the CLI (str, int, ...)."""
        if self.codec is not None:
            return str
        return _scalar(self.type)

    @property
    def optional(self) -> bool:
        """Whether the field defaults to ``None`` (derived); ``None`` travels as "" or 0."""
        return self.default is None

    def value(self, plan: Any) -> Any:
        """The field's value in ``plan`` (a :class:`~ghofl.server.plan.FederationPlan`)."""
        owner = getattr(plan, self.part)
        if self.within == "dp":
            dp = owner.dp
            if dp is None:
                return None if self.attr == "epsilon" else self.default
            return getattr(dp, self.attr)
        return getattr(owner, self.name)

    def to_config(self, value: Any) -> ConfigValue:
        """``value`` as the run config holds it (``None``: the scalar's "" or 0)."""
        if self.codec is not None and value is not None:
            return self.codec.encode(value)
        out: ConfigValue = self.scalar() if value is None else self.scalar(value)
        return out

    def from_config(self, raw: Any) -> Any:
        """The value of a run config's ``raw`` (its "" or 0 is ``None`` for an optional field).

        Raises
        ------
        ConfigError
            ``raw`` has the wrong type; the message names the key.
        """
        if self.codec is not None:
            return self.codec.decode(raw, self.key)
        value = config_scalar(raw, self.scalar, self.key)
        return None if self.optional and value == self.scalar() else value

    @property
    def cli_default(self) -> Any:
        """The default of the field's CLI parameter (``None``: not given)."""
        if self.cli is None or self.cli.unset or self.cli.repeat or self.optional:
            return None
        if self.switch:
            return False
        return self.to_config(self.default)

    @property
    def cli_help(self) -> str:
        """The ``--help`` text: the declared one, and the default where the CLI shows none."""
        assert self.cli is not None
        if self.optional and self.unset:
            return f"{self.cli.help} Default: {self.unset}."
        shown = self.default_text.strip('"')
        if self.cli.unset and shown:
            return f"{self.cli.help} Default: {shown}."
        return self.cli.help

    @property
    def default_text(self) -> str:
        """The default as the docs show it: the run config's literal."""
        if self.default is REQUIRED:
            return "(required)"
        if not self.key:
            return "none"
        return _literal(self.to_config(self.default))

    @property
    def meaning(self) -> str:
        """The docs' line: :attr:`help`, and what the config's "" or 0 means."""
        if not self.unset:
            return self.help
        return f"{self.help}; {_literal(self.scalar())}: {self.unset}"


def _scalar(tp: Any) -> type:
    """str, int, float or bool: the scalar of ``tp`` (``int | None``, ``Literal["a"]``...)."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) \
        else (tp,)
    base = [a for a in args if a is not type(None)]
    if len(base) == 1:
        one = base[0]
        if typing.get_origin(one) is Literal:
            return type(typing.get_args(one)[0])
        if one in (str, int, float, bool):
            return one  # type: ignore[no-any-return]
    raise TypeError(f"{tp!r} is no scalar type: give its FieldSpec a codec")


def config_scalar(raw: Any, scalar: type, key: str) -> Any:
    """``raw`` as a ``scalar`` (str, int, float or bool; an int is a float).

    Raises
    ------
    ConfigError
        ``raw`` is of another type; the message names the run config's ``key``.
    """
    if scalar is bool:
        ok = isinstance(raw, bool)
        what = "true or false"
    elif scalar is str:
        ok = isinstance(raw, str)
        what = "a string"
    else:
        ok = not isinstance(raw, bool) and isinstance(raw, int if scalar is int else int | float)
        what = "an integer" if scalar is int else "a number"
    if not ok:
        raise ConfigError(f"run config key {key!r} must be {what}; got {raw!r}")
    return scalar(raw)


def _literal(value: object) -> str:
    """``value`` as a TOML literal: ``"plain"``, ``2``, ``true``."""
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else f"{value!r}"


# ---------------------------------------------------------------------- codecs
def _decode_classes(raw: Any, key: str) -> tuple[str, ...]:
    if isinstance(raw, list | tuple):
        return tuple(str(c) for c in raw)
    if not isinstance(raw, str):
        raise ConfigError(f"run config key {key!r} must be a JSON list of names, a list, or a "
                          f"comma-separated string; got {raw!r}")
    text = raw.strip()
    if not text.startswith("["):
        return tuple(s.strip() for s in text.split(","))
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"run config key {key!r} is not a valid JSON list ({exc}); got "
                          f"{raw!r}") from None
    if not isinstance(parsed, list) or not all(isinstance(c, str) for c in parsed):
        raise ConfigError(f"run config key {key!r} must be a JSON list of strings; got {raw!r}")
    return tuple(parsed)


def _decode_heads(raw: Any, key: str) -> tuple[str, ...]:
    if isinstance(raw, list | tuple):
        return tuple(str(h) for h in raw)
    if not isinstance(raw, str):
        raise ConfigError(f"run config key {key!r} must be a comma-separated string of heads or "
                          f"a list; got {raw!r}")
    return tuple(h.strip() for h in raw.split(","))


def _encode_head_params(params: Mapping[str, Any]) -> str:
    from ghofl.heads.build import to_jsonable

    return json.dumps(to_jsonable(dict(params)), sort_keys=True)


def _decode_head_params(raw: Any, key: str) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    example = 'give an object such as \'{"lda": {"shrinkage": 0.1}}\''
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"run config key {key!r} is not valid JSON ({exc}); "
                              f"{example}") from None
        if isinstance(parsed, dict):
            return parsed
    raise ConfigError(f"run config key {key!r} must be a JSON object of head parameters; "
                      f"{example}; got {raw!r}")


_CLASSES = Codec(lambda names: json.dumps(list(names)), _decode_classes)
_HEADS = Codec(lambda names: ",".join(names), _decode_heads)
_HEAD_PARAMS = Codec(_encode_head_params, _decode_head_params)


# ---------------------------------------------------------------------- the table
def _read(cls: type, name: str) -> tuple[Any, Any]:
    """The type and default of dataclass ``cls``'s field ``name`` (:data:`REQUIRED`: none)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = REQUIRED
    return typing.get_type_hints(cls)[name], default


def _client(name: str, key: str, flag: str, help_: str, **kw: Any) -> FieldSpec:
    """A client field: type and default read from :class:`~ghofl.client.job.ClientJob`."""
    tp, default = _read(ClientJob, name)
    return FieldSpec(f"client.{name}", key, flag, tp, kw.pop("default", default), help_, **kw)


def _secure(name: str, key: str, flag: str, help_: str, **kw: Any) -> FieldSpec:
    """A secure-round field: type and default read from :class:`~ghofl.secure.SecAggConfig`."""
    tp, default = _read(SecAggConfig, name)
    return FieldSpec(f"aggregation.{name}", key, flag, tp, default, help_, secure_only=True,
                     **kw)


def _dp(attr: str, help_: str, **kw: Any) -> FieldSpec:
    """A differential-privacy field: type and default read from :class:`~ghofl.privacy.DPConfig`.

    ``epsilon``, which DPConfig requires, is ``None`` without DP.
    """
    tp, default = _read(DPConfig, attr)
    if default is REQUIRED:
        tp, default = tp | None, None
    return FieldSpec(f"aggregation.dp_{attr}", f"dp_{attr}", f"--dp-{attr.replace('_', '-')}",
                     tp, default, help_, within="dp", **kw)


def _k_default() -> str:
    from ghofl.privacy import DEFAULT_MIN_CLASS_COUNT

    return f"{DEFAULT_MIN_CLASS_COUNT} with DP, else {_read(ClientJob, 'min_class_count')[1]}"


#: Every option, by plan field, in the order of the commands' --help.
FIELDS: Mapping[str, FieldSpec] = {f.path: f for f in (
    _client("classes", "classes", "--classes",
            "JSON list of class names; labels are indices into it", codec=_CLASSES),
    _client("mode", "mode", "--mode", "upload mode: full, pooled, gram, diag or means",
            cli=CliOption("Upload mode: full (every head), pooled (no QDA), gram (counts, class "
                          "sums and the Gram matrix, as Fed3R: no QDA, no NB), diag (NB only) or "
                          "means (counts and class sums: ncm).")),
    _client("encoder", "encoder", "--encoder",
            "encoder for raw data (a built-in name, onnx:PATH, torchscript:PATH, "
            "hf:NAME_OR_DIR, timm:NAME or open_clip:MODEL@TAG)",
            unset="the inputs are embeddings"),
    _client("encoder_name", "encoder_name", "--encoder-name",
            "encoder name recorded in the payloads of embeddings inputs", unset="none"),
    _client("resolution", "resolution", "--resolution", "input resolution of image encoders"),
    _client("backend", "backend", "--backend", "runtime of the encoder: onnx or torch"),
    _client("projection_dim", "projection_dim", "--projection-dim",
            "dimension k of the public projection", unset="none",
            cli=CliOption("Project embeddings to this dimension K with a public projection: a "
                          "seeded random one, or with --projection-basis the first K principal "
                          "directions of a public basis (every client must use the same).")),
    _client("projection_seed", "projection_seed", "--projection-seed",
            "public seed of the random projection",
            cli=CliOption("Public seed of the random projection (every client the same).",
                          unset=True)),
    _client("projection_basis", "projection_basis", "--projection-basis",
            "fingerprint of a public principal-direction basis; empty: random projection",
            cli=CliOption("With --projection-dim: project onto the first K public principal "
                          "directions of this basis instead of a random projection: its "
                          "16-hex-digit fingerprint, or 'default' for the default basis (ghofl "
                          "projection-basis) of the encoder the embeddings record.", unset=True)),
    _client("clip_norm", "clip_norm", "--clip", "per-sample L2 clipping bound R", unset="none",
            metavar="R",
            cli=CliOption("Per-sample L2 clipping bound R: each client scales its embeddings to "
                          "norm <= R; every client must use the same R (secure aggregation and "
                          "differential privacy need one).")),
    _client("min_class_count", "min_class_count", "--min-class-count",
            "each client drops classes it holds fewer than k samples of; under DP the server "
            "drops classes whose noised count is below k", default=None, unset=_k_default(),
            cli=CliOption("Each client drops classes it holds fewer than K samples of. With "
                          "--dp-epsilon the server instead drops classes whose noised count is "
                          "below K, which costs no privacy.")),
    _client("holdout_fraction", "holdout_fraction", "--holdout",
            "fraction of samples whose sums are also uploaded as a held-out section",
            cli=CliOption("Each client also uploads the sums of a held-out fraction F in (0, "
                          "0.5] of its samples (seeded per-sample split), so the server can "
                          "choose hyperparameters on held-out moments; every client must use the "
                          "same F. 0: none.")),
    _client("holdout_seed", "holdout_seed", "--holdout-seed",
            "seed of the per-sample held-out split",
            cli=CliOption("Seed of the held-out split (every client the same).")),
    _client("transport_dtype", "transport_dtype", "--transport-dtype",
            "dtype of the float sums of plain uploads: float64 or float32",
            cli=CliOption("Dtype of the float sums of the plain uploads: float64, or float32 "
                          "(half the bytes; the server still adds them in float64).")),
    _client("feature_transform", "feature_transform", "--feature-transform",
            "none, sqrt, x+sqrt or x+sqrt+rbf:<fingerprint>",
            cli=CliOption("Transform of the embeddings before the statistics: none, sqrt, "
                          "x+sqrt (appends sqrt(max(x, 0)): doubles d; in pooled mode the linear "
                          "heads then reach the centralised probe), or x+sqrt+rbf:FINGERPRINT "
                          "(x+sqrt, then Gaussian-kernel similarities to the public anchors of "
                          "the kernel map that ghofl feature-map built: kernel heads from one "
                          "upload). Every client must use the same; the test embeddings get it "
                          "too.")),
    FieldSpec("aggregation.protocol", "protocol", "--secure", Literal["plain", "secure"],
              "plain", "plain (one-stage sum) or secure (the server learns only the sum)",
              switch=True, on="secure", off="plain",
              cli=CliOption("Aggregate with the secure protocol (the server learns only the "
                            "sum; needs --clip), or the plain sum.", off_flag="--plain")),
    _secure("threshold", "threshold", "--threshold",
            "secure: fewest clients that must remain",
            unset="(n + floor(gamma*n))//2 + 1, about two thirds at the default gamma",
            cli=CliOption("Secure: fewest clients that must remain at every stage.")),
    _secure("neighbours", "neighbours", "--neighbours",
            "secure: neighbours per client on the SecAgg+ graph",
            unset="the smallest degree meeting the exposure and abort targets",
            cli=CliOption("Secure: neighbours per client on the SecAgg+ graph.")),
    _secure("max_samples", "max_samples", "--max-samples",
            "secure: public maximum samples per client",
            cli=CliOption("Secure: public maximum samples per client (bounds the fixed-point "
                          "range).")),
    _secure("limbs", "limbs", "--limbs",
            "secure: 64-bit words per float statistic (2 exact, 1 half the bytes)",
            cli=CliOption("Secure: 64-bit words per float statistic, 2 (exact) or 1 (half the "
                          "bytes).")),
    _secure("corrupt_fraction", "corrupt_fraction", "--corrupt-fraction",
            "secure: fraction gamma of clients that may collude with the server (sets the "
            "default threshold)", metavar="GAMMA",
            cli=CliOption("Secure: fraction GAMMA in [0, 1) of the clients that may collude "
                          "with the server; sets the default threshold (n + floor(GAMMA*n))//2 "
                          "+ 1 and, with the next three, the graph degree and share threshold. "
                          "The local clients (simulated, or flower-run's nodes) hold the same "
                          "value as their own policy.")),
    _secure("dropout_fraction", "dropout_fraction", "--dropout-fraction",
            "secure: fraction delta of clients expected to drop out (sizes the graph)",
            metavar="DELTA",
            cli=CliOption("Secure: fraction DELTA in [0, 1) of the clients expected to drop "
                          "out; GAMMA + DELTA < 1.")),
    _secure("sigma", "exposure_bits", "--exposure-bits",
            "secure: a client's statistics are exposed with probability <= 2^-bits",
            metavar="BITS",
            cli=CliOption("Secure: exposure target SIGMA > 0: a client's statistics reach the "
                          "server with probability <= 2^-SIGMA per round.")),
    _secure("eta", "abort_bits", "--abort-bits",
            "secure: a round aborts for a client with probability <= 2^-bits", metavar="BITS",
            cli=CliOption("Secure: abort target ETA > 0: a client's secrets cannot be recovered "
                          "(the round aborts) with probability <= 2^-ETA per round.")),
    FieldSpec("aggregation.regions", "regions", "--regions", int | None, None,
              "secure: R public regions, a secure round each, then one over the regional sums "
              "(in process, or on Flower over each region's nodes)", unset="one flat round",
              secure_only=True,
              cli=CliOption("Secure: split the clients into R public regions (contiguous groups "
                            "of the sorted ids), each a secure round, then one secure round over "
                            "the R regional sums (exact; a client's cost depends on its "
                            "region's size only). --threshold and --neighbours apply per "
                            "region.")),
    _dp("epsilon", "differential privacy budget epsilon", unset="no DP",
        cli=CliOption("Differential privacy: release the total with the Gaussian mechanism "
                      "calibrated to this epsilon (needs every client's clipping bound "
                      "--clip).")),
    _dp("delta", "differential privacy delta",
        cli=CliOption("Differential privacy: delta.", unset=True)),
    _dp("mode", "central (the server noises the total) or distributed (client noise shares)",
        choices=("central", "distributed"),
        cli=CliOption("Differential privacy: 'central' (the server noises the total) or "
                      "'distributed' (each client adds a noise share before secure "
                      "aggregation; needs --secure).", unset=True)),
    _dp("split", "how the DP budget is split over counts, sums and second moments: auto (from "
        "the expected error of the moments) or equal", choices=("auto", "equal"),
        cli=CliOption("Differential privacy: how the budget is split over counts, sums and "
                      "second moments: 'auto' (from the expected error of the moments, told "
                      "the expected sample count) or 'equal'.", unset=True)),
    _dp("expected_samples", "public hint of the federation's total sample count for the auto "
        "DP budget split", unset="unknown (equal split; ghofl simulate: its training set's "
        "size)",
        cli=CliOption("Differential privacy: the public sample count the auto split "
                      "assumes.")),
    _dp("subspace", "public subspace the server fits the DP release in: auto, auto:FP, none, "
        "pca:K or pca:K:FP (post-processing, no budget)",
        cli=CliOption("Differential privacy: the public subspace the server fits the release "
                      "in (post-processing: no budget). 'auto' projects the noisy total onto "
                      "the first 0.4*d principal directions of the encoder's default public "
                      "basis (ghofl projection-basis) when the noise ratio "
                      "sigma_B*d/(R^2*(N-C)) exceeds 0.12 and they keep 0.9 of the classes' "
                      "separation; 'auto:FP' with basis FP; 'none' never; 'pca:K[:FP]' always "
                      "K directions.", unset=True)),
    _dp("prior", "public within-class covariance the server mixes the denoised DP release's "
        "pooled covariance with: auto, auto:FP or none (post-processing, no budget)",
        cli=CliOption("Differential privacy: a public within-class covariance the server "
                      "mixes the denoised pooled covariance of a pooled or gram release with "
                      "(post-processing: no budget), at the weight that minimises an estimate "
                      "of its error. 'auto' takes the encoder's default (ghofl "
                      "covariance-prior; none recorded: no prior); 'auto:FP' covariance FP; "
                      "'none' never.", unset=True)),
    FieldSpec("aggregation.store", "store", "--store", str, "",
              "durable store recording every accepted contribution (plain protocol)",
              cli=CliOption("Aggregation store (SQLite file, created if absent) recording each "
                            "accepted contribution durably (plain protocol).")),
    FieldSpec("aggregation.estimate", "estimate", "--estimate", Literal["sum", "fedcof"], "sum",
              "what the heads are fitted from: sum (the total of the uploads) or fedcof "
              "(FedCOF's class covariances from each client's class means and counts; plain "
              "protocol without DP or store)", choices=("sum", "fedcof"),
              cli=CliOption("What the server fits the heads from: 'sum' (the total of the "
                            "uploads) or 'fedcof' (FedCOF's estimate of the class covariances "
                            "from each client's class means and counts, so that lda, ridge, "
                            "fedcof and every head of second moments fit from 'means' uploads; "
                            "it reads each client's own upload: plain protocol only, without "
                            "DP or a store).")),
    FieldSpec("aggregation.drops", "", "--drop", Mapping[str, int], {},
              "simulation only: STAGE=COUNT clients vanish at STAGE",
              cli=CliOption("STAGE=COUNT: COUNT clients vanish at STAGE (secure: advertise, "
                            "reveal, share, mask, consistency, unmask; a drop at reveal aborts "
                            "the round; plain: input). Repeatable.", repeat=True)),
    FieldSpec("server.heads", "heads", "--heads", tuple[str, ...], ("nb", "lda", "qda", "fedcgs"),
              "comma-separated registered heads, or all", codec=_HEADS,
              cli=CliOption("Comma-separated registered heads, or 'all'.")),
    FieldSpec("server.head_params", "head_params", "--param", dict[str, dict[str, Any]], {},
              "JSON object {head: {param: value}} overriding the preset", codec=_HEAD_PARAMS,
              cli=CliOption("Head hyperparameter HEAD.KEY=VALUE (repeatable), e.g. "
                            "lda.shrinkage=auto.", repeat=True)),
    FieldSpec("server.seed", "seed", "--seed", int, 0, "seed of every head that takes one",
              cli=CliOption("Seed of every head that takes one (ghofl simulate: also of the "
                            "partition and of the noise; ghofl aggregate: of the DP noise, "
                            "which comes from OS entropy without it).")),
    FieldSpec("server.progress", "progress", "--progress", bool, False,
              "progress output of the heads that report it",
              cli=CliOption("Show progress of trainable heads.")),
    FieldSpec("server.preset", "preset", "--preset", str, DEFAULT_PRESET,
              "named head hyperparameters: default or paper",
              cli=CliOption("Named head hyperparameters: 'default' (chosen from the data) or "
                            "'paper' (the paper's fixed values); --param overrides them.")),
)}


def part_fields(part: str) -> tuple[FieldSpec, ...]:
    """The fields of one part (``client``, ``aggregation``, ``server``), in :data:`FIELDS` order."""
    return tuple(f for f in FIELDS.values() if f.part == part)


def upload_fields() -> tuple[FieldSpec, ...]:
    """The upload options: the client fields with a :class:`CliOption`, in :data:`FIELDS` order."""
    return tuple(f for f in part_fields("client") if f.cli is not None)


def check_spellings(config: Mapping[str, Any], what: str = "run config",
                    paths: tuple[str, ...] | None = None) -> None:
    """Refuse a key spelt with hyphens where the table's key has underscores.

    Parameters
    ----------
    config : mapping
        A run config (or a node config, which holds some of the same keys).
    what : str, default "run config"
        The config's name, for the message.
    paths : tuple of str, optional
        The plan fields whose keys ``config`` may hold (default: every field).

    Raises
    ------
    ConfigError
        E.g. ``run config key 'dp-epsilon' is now 'dp_epsilon'; rename it``.
    """
    for spec in FIELDS.values() if paths is None else (FIELDS[p] for p in paths):
        old = spec.key.replace("_", "-")
        if old != spec.key and old in config:
            raise ConfigError(f"{what} key {old!r} is now {spec.key!r}; rename it")


@dataclass(frozen=True)
class Naming:
    """How one front end names the options (see the module docstring).

    Parameters
    ----------
    style : {"library", "cli", "config"}
        Plan fields, CLI flags or config keys.
    """

    style: Literal["library", "cli", "config"]

    def name(self, path: str) -> str:
        """The field as the front end names it.

        E.g. ``--clip``, ``clip_norm``, ``ClientJob clip_norm``.
        """
        spec = FIELDS[path]
        if self.style == "cli" and spec.flag:
            return spec.flag
        if self.style == "config" and spec.key:
            return spec.key
        return LibraryNames().name(path)

    def ask(self, path: str) -> str:
        """The field as a request for a value: ``--clip R`` on the CLI, else :meth:`name`."""
        spec = FIELDS[path]
        if self.style == "cli" and spec.flag and spec.metavar:
            return f"{spec.flag} {spec.metavar}"
        return self.name(path)

    def setting(self, path: str, value: object) -> str:
        """The field set to ``value``.

        E.g. ``--secure``, ``--dp-mode distributed``, ``protocol = "secure"``.
        """
        spec = FIELDS[path]
        if self.style == "cli" and spec.flag:
            return spec.flag if spec.switch else f"{spec.flag} {value}"
        return f"{self.name(path)} = {_literal(value)}"

    def reset(self, paths: tuple[tuple[str, object], ...]) -> str:
        """A remedy that sets any one of the fields back to the given value.

        E.g. ``drop --transport-dtype or --secure`` (CLI),
        ``set transport_dtype = "float64" or protocol = "plain"`` (config).
        """
        if self.style == "cli":
            return "drop " + " or ".join(FIELDS[p].flag for p, _ in paths)
        return "set " + " or ".join(self.setting(p, v) for p, v in paths)


LIBRARY = Naming("library")
CLI = Naming("cli")
CONFIG = Naming("config")


def key_table() -> str:
    """The docs' table of every option: plan field, config key, CLI flag, type, default."""
    rows = ["| plan field | config key | CLI flag | type | default | meaning |",
            "|---|---|---|---|---|---|"]
    rows += [f"| `{f.path}` | {f'`{f.key}`' if f.key else '—'} | `{f.flag}` | "
             f"{f.scalar.__name__ if f.key else '—'} | {f.default_text} | {f.meaning} |"
             for f in FIELDS.values()]
    return "\n".join(rows)
