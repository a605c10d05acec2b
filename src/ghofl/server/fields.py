"""Every option of a federation, declared once: its plan field, config key, CLI flag and help.

A front end names an option in its own vocabulary: the CLI by flag (``--transport-dtype``), a
TOML or Flower run config by key (``transport_dtype``), the library by plan field
(``client.transport_dtype``). :data:`FIELDS` is the one table of those names;
:class:`Naming` renders a field, or a setting of it, for one vocabulary, so that an error of
the plan (:class:`~ghofl.server.plan.PlanError`) reads right in each front end without any
editing of its text. :func:`key_table` renders the table for the docs.

The upload options (:func:`upload_fields`: the client fields with a :class:`CliOption`) are
also the CLI parameters of every command that runs a client job (``ghofl client-stats``,
``ghofl simulate``, ``ghofl flower-run``): :func:`ghofl.cli._options.upload_options` builds
them from this table, so adding one needs its declaration here, its
:class:`~ghofl.client.job.ClientJob` field and its use, and its test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ghofl.errors import LibraryNames

__all__ = ["CLI", "CONFIG", "FIELDS", "LIBRARY", "CliOption", "FieldSpec", "Naming", "key_table",
           "upload_fields"]

#: Python type of a CLI parameter, by the :attr:`FieldSpec.type` the docs show.
_PYTHON_TYPES: Mapping[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class CliOption:
    """An upload option as a parameter of the commands that run a client job.

    Attributes
    ----------
    default : object
        The parameter's value without the flag; ``None``: not given, so the
        :class:`~ghofl.client.job.ClientJob` default applies (or what the command derives).
    help : str
        Its ``--help`` text, the same in every command.
    """

    default: object
    help: str


@dataclass(frozen=True)
class FieldSpec:
    """One option of a federation.

    Attributes
    ----------
    path : str
        Plan field, ``"<part>.<name>"`` with part ``client``, ``aggregation`` or ``server``.
    key : str
        Key in a TOML or Flower run config.
    flag : str
        CLI flag (``""``: the CLI has none).
    type : str
        Type as the docs show it (``"float"``, ``"str"``, ...).
    default : str
        Default as the docs show it.
    help : str
        One line for the docs' key table.
    metavar : str, default ""
        What the flag takes, for messages asking for it (``"R"`` in ``--clip R``).
    switch : bool, default False
        A CLI switch that stands for one value of the field (``--secure`` for
        ``protocol = "secure"``); ``off`` is the value it stands against.
    off : str, default ""
        With ``switch``: the field's value without the switch.
    cli : CliOption or None, default None
        For a client field: the field is an upload option, a parameter (``flag``) of every
        command that runs a client job (:func:`upload_fields`).
    """

    path: str
    key: str
    flag: str
    type: str
    default: str
    help: str
    metavar: str = ""
    switch: bool = False
    off: str = ""
    cli: CliOption | None = None

    @property
    def name(self) -> str:
        """The field's name in its part (``clip_norm`` of ``client.clip_norm``)."""
        return self.path.partition(".")[2]

    @property
    def python_type(self) -> object:
        """The CLI parameter's type: that of :attr:`type`, optional if its default is ``None``."""
        base = _PYTHON_TYPES[self.type]
        return base | None if self.cli is not None and self.cli.default is None else base


def _f(path: str, key: str, flag: str, type_: str, default: str, help_: str, *,
       metavar: str = "", off: str = "", cli: CliOption | None = None) -> FieldSpec:
    return FieldSpec(path, key, flag, type_, default, help_, metavar, switch=bool(off), off=off,
                     cli=cli)


#: Every option, by plan field; the upload options in the order of the commands' --help.
FIELDS: Mapping[str, FieldSpec] = {f.path: f for f in (
    _f("client.classes", "classes", "--classes", "str", "(required)",
       "JSON list of class names; labels are indices into it"),
    _f("client.mode", "mode", "--mode", "str", '"full"',
       "upload mode: full, pooled, gram, diag or means",
       cli=CliOption("full", "Upload mode: full (every head), pooled (no QDA), gram (counts, "
                     "class sums and the Gram matrix, as Fed3R: no QDA, no NB), diag (NB "
                     "only) or means (counts and class sums: ncm).")),
    _f("client.encoder", "encoder", "--encoder", "str", '""',
       "encoder for raw data (a built-in name, onnx:PATH, torchscript:PATH, hf:NAME_OR_DIR, "
       "timm:NAME or open_clip:MODEL@TAG); empty: the inputs are embeddings"),
    _f("client.projection_dim", "projection_dim", "--projection-dim", "int", "0",
       "dimension k of the public projection; 0: none",
       cli=CliOption(None, "Project embeddings to this dimension K with a public projection: "
                     "a seeded random one, or with --projection-basis the first K principal "
                     "directions of a public basis (every client must use the same).")),
    _f("client.projection_seed", "projection_seed", "--projection-seed", "int", "0",
       "public seed of the random projection",
       cli=CliOption(None, "Public seed of the random projection (default 0; every client the "
                     "same).")),
    _f("client.projection_basis", "projection_basis", "--projection-basis", "str", '""',
       "fingerprint of a public principal-direction basis; empty: random projection",
       cli=CliOption(None, "With --projection-dim: project onto the first K public principal "
                     "directions of this basis instead of a random projection: its "
                     "16-hex-digit fingerprint, or 'default' for the default basis (ghofl "
                     "projection-basis) of the encoder the embeddings record.")),
    _f("client.clip_norm", "clip_norm", "--clip", "float", "0.0",
       "per-sample L2 clipping bound R; 0: none", metavar="R",
       cli=CliOption(None, "Per-sample L2 clipping bound R: each client scales its embeddings "
                     "to norm <= R; every client must use the same R (secure aggregation and "
                     "differential privacy need one).")),
    _f("client.min_class_count", "min-class-count", "--min-class-count", "int",
       "5 with DP, else 1", "each client drops classes it holds fewer than k samples of; "
       "under DP the server drops classes whose noised count is below k",
       cli=CliOption(None, "Each client drops classes it holds fewer than K samples of (1, "
                     "i.e. off, by default). With --dp-epsilon (default 5) the server instead "
                     "drops classes whose noised count is below K, which costs no privacy.")),
    _f("client.holdout_fraction", "holdout_fraction", "--holdout", "float", "0.0",
       "fraction of samples whose sums are also uploaded as a held-out section",
       cli=CliOption(0.0, "Each client also uploads the sums of a held-out fraction F in (0, "
                     "0.5] of its samples (seeded per-sample split), so the server can choose "
                     "hyperparameters on held-out moments; every client must use the same F. "
                     "0: none.")),
    _f("client.holdout_seed", "holdout_seed", "--holdout-seed", "int", "0",
       "seed of the per-sample held-out split",
       cli=CliOption(0, "Seed of the held-out split (every client the same).")),
    _f("client.transport_dtype", "transport_dtype", "--transport-dtype", "str", '"float64"',
       "dtype of the float sums of plain uploads: float64 or float32",
       cli=CliOption("float64", "Dtype of the float sums of the plain uploads: float64, or "
                     "float32 (half the bytes; the server still adds them in float64).")),
    _f("client.feature_transform", "feature_transform", "--feature-transform", "str",
       '"none"', "none, sqrt, x+sqrt or x+sqrt+rbf:<fingerprint>",
       cli=CliOption("none", "Transform of the embeddings before the statistics: none, sqrt, "
                     "x+sqrt (appends sqrt(max(x, 0)): doubles d; in pooled mode the linear "
                     "heads then reach the centralised probe), or x+sqrt+rbf:FINGERPRINT "
                     "(x+sqrt, then Gaussian-kernel similarities to the public anchors of the "
                     "kernel map that ghofl feature-map built: kernel heads from one upload). "
                     "Every client must use the same; the test embeddings get it too.")),
    _f("aggregation.protocol", "protocol", "--secure", "str", '"secure" (CLI: plain)',
       "plain (one-stage sum) or secure (the server learns only the sum)", off="plain"),
    _f("aggregation.threshold", "threshold", "--threshold", "int", "0",
       "secure: fewest clients that must remain; 0: (n + floor(gamma*n))//2 + 1, about two "
       "thirds at the default gamma"),
    _f("aggregation.neighbours", "neighbours", "--neighbours", "int", "0",
       "secure: neighbours per client on the SecAgg+ graph; 0: the default"),
    _f("aggregation.max_samples", "max-samples", "--max-samples", "int", "1000000",
       "secure: public maximum samples per client"),
    _f("aggregation.limbs", "limbs", "--limbs", "int", "2",
       "secure: 64-bit words per float statistic (2 exact, 1 half the bytes)"),
    _f("aggregation.corrupt_fraction", "corrupt-fraction", "--corrupt-fraction", "float",
       "0.3333333333333333", "secure: fraction gamma of clients that may collude with the "
       "server (sets the default threshold)", metavar="GAMMA"),
    _f("aggregation.dropout_fraction", "dropout-fraction", "--dropout-fraction", "float",
       "0.3333333333333333", "secure: fraction delta of clients expected to drop out (sizes "
       "the graph)", metavar="DELTA"),
    _f("aggregation.sigma", "exposure-bits", "--exposure-bits", "float", "40.0",
       "secure: a client's statistics are exposed with probability <= 2^-bits", metavar="BITS"),
    _f("aggregation.eta", "abort-bits", "--abort-bits", "float", "20.0",
       "secure: a round aborts for a client with probability <= 2^-bits", metavar="BITS"),
    _f("aggregation.regions", "regions", "--regions", "int", "0",
       "secure: R public regions, a secure round each, then one over the regional sums "
       "(in process, or on Flower over each region's nodes); 0: one flat round"),
    _f("aggregation.dp_epsilon", "dp-epsilon", "--dp-epsilon", "float", "0.0",
       "differential privacy budget epsilon; 0: no DP"),
    _f("aggregation.dp_delta", "dp-delta", "--dp-delta", "float", "1e-05",
       "differential privacy delta"),
    _f("aggregation.dp_mode", "dp-mode", "--dp-mode", "str", '"central"',
       "central (the server noises the total) or distributed (client noise shares)"),
    _f("aggregation.dp_split", "dp-split", "--dp-split", "str", '"auto"',
       "how the DP budget is split over counts, sums and second moments: auto (from the "
       "expected error of the moments) or equal"),
    _f("aggregation.dp_expected_samples", "dp-expected-samples", "--dp-expected-samples",
       "int", "0", "public hint of the federation's total sample count for the auto DP "
       "budget split (0: unknown, equal split; ghofl simulate: its training set's size)"),
    _f("aggregation.store", "store", "--store", "str", '""',
       "durable store recording every accepted contribution (plain protocol)"),
    _f("aggregation.drops", "drop", "--drop", "str", '""',
       "simulation only: STAGE=COUNT clients vanish at STAGE"),
    _f("server.heads", "heads", "--heads", "str", "(required)",
       "comma-separated registered heads, or all"),
    _f("server.head_params", "head_params", "--param", "str", '""',
       "JSON object {head: {param: value}} overriding the preset"),
    _f("server.seed", "seed", "--seed", "int", "0", "seed of every head that takes one"),
    _f("server.preset", "preset", "--preset", "str", '"default"',
       "named head hyperparameters: default or paper"),
)}


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
        return spec.key if self.style == "config" else LibraryNames().name(path)

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


def _literal(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else f"{value!r}"


LIBRARY = Naming("library")
CLI = Naming("cli")
CONFIG = Naming("config")


def upload_fields() -> tuple[FieldSpec, ...]:
    """The upload options: the client fields with a :class:`CliOption`, in :data:`FIELDS` order."""
    return tuple(f for f in FIELDS.values() if f.path.startswith("client.") and f.cli is not None)


def key_table() -> str:
    """The docs' table of every option: plan field, config key, CLI flag, type, default."""
    rows = ["| plan field | config key | CLI flag | type | default | meaning |",
            "|---|---|---|---|---|---|"]
    rows += [f"| `{f.path}` | `{f.key}` | `{f.flag}` | {f.type} | {f.default} | {f.help} |"
             for f in FIELDS.values()]
    return "\n".join(rows)
