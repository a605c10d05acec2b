"""Every option of a federation, declared once: its plan field, config key, CLI flag and help.

A front end names an option in its own vocabulary: the CLI by flag (``--transport-dtype``), a
TOML or Flower run config by key (``transport_dtype``), the library by plan field
(``client.transport_dtype``). :data:`FIELDS` is the one table of those names;
:class:`Naming` renders a field, or a setting of it, for one vocabulary, so that an error of
the plan (:class:`~ghofl.server.plan.PlanError`) reads right in each front end without any
editing of its text. :func:`key_table` renders the table for the docs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ghofl.errors import LibraryNames

__all__ = ["CLI", "CONFIG", "FIELDS", "LIBRARY", "FieldSpec", "Naming", "key_table"]


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


def _f(path: str, key: str, flag: str, type_: str, default: str, help_: str, *,
       metavar: str = "", off: str = "") -> FieldSpec:
    return FieldSpec(path, key, flag, type_, default, help_, metavar, switch=bool(off), off=off)


#: Every option, by plan field.
FIELDS: Mapping[str, FieldSpec] = {f.path: f for f in (
    _f("client.classes", "classes", "--classes", "str", "(required)",
       "JSON list of class names; labels are indices into it"),
    _f("client.mode", "mode", "--mode", "str", '"full"', "upload mode: full, pooled or diag"),
    _f("client.encoder", "encoder", "--encoder", "str", '""',
       "encoder for raw data (a built-in name, onnx:PATH or torchscript:PATH); empty: the "
       "inputs are embeddings"),
    _f("client.feature_transform", "feature_transform", "--feature-transform", "str",
       '"none"', "none, sqrt, x+sqrt or x+sqrt+rbf:<fingerprint>"),
    _f("client.projection_dim", "projection_dim", "--projection-dim", "int", "0",
       "dimension k of the public projection; 0: none"),
    _f("client.projection_seed", "projection_seed", "--projection-seed", "int", "0",
       "public seed of the random projection"),
    _f("client.projection_basis", "projection_basis", "--projection-basis", "str", '""',
       "fingerprint of a public principal-direction basis; empty: random projection"),
    _f("client.clip_norm", "clip_norm", "--clip", "float", "0.0",
       "per-sample L2 clipping bound R; 0: none", metavar="R"),
    _f("client.min_class_count", "min-class-count", "--min-class-count", "int",
       "5 with DP, else 1", "each client drops classes it holds fewer than k samples of; "
       "under DP the server drops classes whose noised count is below k"),
    _f("client.holdout_fraction", "holdout_fraction", "--holdout", "float", "0.0",
       "fraction of samples whose sums are also uploaded as a held-out section"),
    _f("client.holdout_seed", "holdout_seed", "--holdout-seed", "int", "0",
       "seed of the per-sample held-out split"),
    _f("client.transport_dtype", "transport_dtype", "--transport-dtype", "str", '"float64"',
       "dtype of the float sums of plain uploads: float64 or float32"),
    _f("aggregation.protocol", "protocol", "--secure", "str", '"secure" (CLI: plain)',
       "plain (one-stage sum) or secure (the server learns only the sum)", off="plain"),
    _f("aggregation.threshold", "threshold", "--threshold", "int", "0",
       "secure: fewest clients that must remain; 0: about two thirds"),
    _f("aggregation.neighbours", "neighbours", "--neighbours", "int", "0",
       "secure: neighbours per client on the SecAgg+ graph; 0: the default"),
    _f("aggregation.max_samples", "max-samples", "--max-samples", "int", "1000000",
       "secure: public maximum samples per client"),
    _f("aggregation.limbs", "limbs", "--limbs", "int", "2",
       "secure: 64-bit words per float statistic (2 exact, 1 half the bytes)"),
    _f("aggregation.dp_epsilon", "dp-epsilon", "--dp-epsilon", "float", "0.0",
       "differential privacy budget epsilon; 0: no DP"),
    _f("aggregation.dp_delta", "dp-delta", "--dp-delta", "float", "1e-05",
       "differential privacy delta"),
    _f("aggregation.dp_mode", "dp-mode", "--dp-mode", "str", '"central"',
       "central (the server noises the total) or distributed (client noise shares)"),
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


def key_table() -> str:
    """The docs' table of every option: plan field, config key, CLI flag, type, default."""
    rows = ["| plan field | config key | CLI flag | type | default | meaning |",
            "|---|---|---|---|---|---|"]
    rows += [f"| `{f.path}` | `{f.key}` | `{f.flag}` | {f.type} | {f.default} | {f.help} |"
             for f in FIELDS.values()]
    return "\n".join(rows)
