"""Text encoders as ONNX graphs: token ids → sentence embeddings (``ghofl export``).

A text encoder that can be exported describes itself by a :class:`TextGraphSpec`: a torch
module from ``input_ids``/``attention_mask`` to token embeddings, the pooling and normalisation
applied to them, and a ``tokenizers`` tokenizer set up (truncation, padding) exactly as the
encoder tokenizes. :func:`text_graph_spec` builds it for
:class:`~ghofl.client.encoders.text.SentenceTransformerEncoder` (a transformer, then mean or
CLS pooling, then L2 normalisation, as ``SentenceTransformer.encode(normalize_embeddings=True)``
computes), and for any other encoder that has a method ``onnx_text_spec() -> TextGraphSpec``.

:func:`text_encoder_onnx` exports the module with the pooling and normalisation as one ONNX
graph (the legacy TorchScript exporter, opset :data:`TEXT_OPSET`)::

    input_ids       int64 (N, L)
    attention_mask  int64 (N, L)   1 for tokens, 0 for padding
    sentence_embedding float32 (N, d)

N and L are dynamic. :func:`check_text_export` runs it on probe sentences with ONNX Runtime,
tokenized by the spec's tokenizer alone, and compares with the encoder's own output.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import Encoder
from ghofl.errors import ConfigError, require_extra

if TYPE_CHECKING:
    import onnx
    import tokenizers

__all__ = [
    "EMBEDDING_NAME",
    "POOLINGS",
    "PROBE_TEXTS",
    "TEXT_INPUTS",
    "TEXT_OPSET",
    "TextGraphSpec",
    "check_text_export",
    "export_tokenizer",
    "hf_body",
    "sentence_transformer_spec",
    "text_encoder_onnx",
    "text_graph_spec",
    "tokenize",
]

TEXT_OPSET = 17
#: Inputs of the exported graph, both int64 (N, L).
TEXT_INPUTS = ("input_ids", "attention_mask")
EMBEDDING_NAME = "sentence_embedding"
#: ``mean``: masked mean over the tokens (padding excluded); ``cls``: the first token.
POOLINGS = ("mean", "cls")
#: Sentences the export is checked on: case, accents, CJK, punctuation, spaces, one long text.
PROBE_TEXTS = (
    "The quick brown fox JUMPS over the lazy dog.",
    "hi",
    "  Leading and trailing spaces  ",
    "Ça va? Größe, naïve café — 東京 2024!",
    "numbers 3.14159 and e-mail a.b@example.org",
    " ".join(["long"] * 600),
)


@dataclass(frozen=True)
class TextGraphSpec:
    """What the ONNX export needs to know about a text encoder.

    Attributes
    ----------
    body : torch.nn.Module
        ``body(input_ids, attention_mask)`` (both int64 (N, L)) → token embeddings float32
        (N, L, H), e.g. a transformers model's ``last_hidden_state``.
    tokenizer : tokenizers.Tokenizer
        Tokenizes as the encoder does, truncation and padding to the longest item of the
        batch configured (:func:`export_tokenizer`).
    max_length : int
        Truncation length in tokens.
    pooling : {"mean", "cls"}
        Pooling of the token embeddings.
    normalize : bool
        L2-normalise the pooled vectors (x / max(‖x‖, 1e-12)).
    reference : callable, optional
        ``reference(texts) -> {"input_ids": ..., "attention_mask": ...}``: the encoder's own
        tokenization; the tokenizer is checked against it before export.
    """

    body: Any
    tokenizer: Any
    max_length: int
    pooling: str = "mean"
    normalize: bool = True
    reference: Callable[[list[str]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        """Refuse an unknown pooling or a non-positive ``max_length``."""
        if self.pooling not in POOLINGS:
            raise ConfigError(f"text pooling must be one of {', '.join(POOLINGS)}; got "
                              f"{self.pooling!r}")
        if int(self.max_length) < 1:
            raise ConfigError(f"max_length must be a positive integer; got {self.max_length!r}")


def export_tokenizer(backend: tokenizers.Tokenizer, max_length: int, *, pad_id: int,
                     pad_token: str, pad_type_id: int = 0, padding_side: str = "right",
                     truncation_side: str = "right") -> tokenizers.Tokenizer:
    """A copy of ``backend`` that truncates to ``max_length`` and pads to the longest item.

    Parameters
    ----------
    backend : tokenizers.Tokenizer
        E.g. a transformers fast tokenizer's ``backend_tokenizer`` (left unchanged).
    max_length : int
    pad_id, pad_token, pad_type_id :
        The padding token.
    padding_side, truncation_side : {"right", "left"}

    Returns
    -------
    tokenizers.Tokenizer
        ``encode_batch(texts)`` gives rectangular ``ids`` and ``attention_mask``.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(backend.to_str())
    tok.no_truncation()
    tok.no_padding()
    tok.enable_truncation(int(max_length), strategy="longest_first", direction=truncation_side)
    tok.enable_padding(direction=padding_side, pad_id=int(pad_id), pad_type_id=int(pad_type_id),
                       pad_token=str(pad_token))
    return tok


def tokenize(tokenizer: tokenizers.Tokenizer, texts: Sequence[str]
             ) -> dict[str, NDArray[np.int64]]:
    """``input_ids`` and ``attention_mask``, int64 (N, L), of ``texts`` by ``tokenizer``."""
    enc = tokenizer.encode_batch(list(texts))
    return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64).reshape(len(enc), -1),
            "attention_mask": np.array([e.attention_mask for e in enc],
                                       dtype=np.int64).reshape(len(enc), -1)}


def _module_kind(module: Any) -> str:
    return type(module).__name__


def _pooling_mode(config: dict[str, Any]) -> str:
    """``"mean"``, ``"cls"``, ... from a Pooling config (``pooling_mode``, or the older flags)."""
    mode = config.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6: one boolean per mode
        flags = [k for k, v in config.items() if k.startswith("pooling_mode_") and v is True]
        mode = [f.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
                for f in flags]
    if isinstance(mode, (list, tuple)):
        mode = mode[0] if len(mode) == 1 else "+".join(map(str, mode))
    return str(mode)


def sentence_transformer_spec(model: Any, normalize: bool = True) -> TextGraphSpec:
    """The spec of a loaded ``SentenceTransformer``: Transformer, Pooling, [Normalize].

    The vectors are L2-normalised when ``normalize`` (``encode(normalize_embeddings=True)``,
    ghofl's default) or when the model ends in a Normalize module.

    Raises
    ------
    ConfigError
        Other modules (Dense, a second Transformer, ...) or a pooling other than mean or CLS.
    """
    modules = list(model)
    kinds = [_module_kind(m) for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
        raise ConfigError(
            f"the sentence-transformers model has the modules {', '.join(kinds)}; only "
            "Transformer + Pooling (+ Normalize) can be exported as one graph; export the head "
            "alone with --head-only"
        )
    transformer, pooling = modules[0], modules[1]
    mode = _pooling_mode(pooling.get_config_dict())
    if mode not in POOLINGS:
        raise ConfigError(f"the sentence-transformers pooling {mode!r} has no ONNX export in "
                          f"ghofl (only {', '.join(POOLINGS)}); export the head alone with "
                          "--head-only")
    hf_tok = model.tokenizer
    max_length = int(transformer.max_seq_length or hf_tok.model_max_length)
    tok = export_tokenizer(hf_tok.backend_tokenizer, max_length, pad_id=hf_tok.pad_token_id,
                           pad_token=hf_tok.pad_token,
                           pad_type_id=getattr(hf_tok, "pad_token_type_id", 0),
                           padding_side=hf_tok.padding_side,
                           truncation_side=hf_tok.truncation_side)

    def reference(texts: list[str]) -> dict[str, Any]:
        prepare = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers < 6
        feats = prepare(texts)
        return {k: feats[k].numpy() for k in TEXT_INPUTS}

    return TextGraphSpec(hf_body(transformer.auto_model), tok, max_length, str(mode),
                         bool(normalize) or "Normalize" in kinds, reference)


def hf_body(hf_model: Any) -> Any:
    """A torch module: (input_ids, attention_mask) → ``hf_model(...).last_hidden_state``."""
    import torch

    class _Body(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return _Body(hf_model).eval()


def text_graph_spec(encoder: Encoder) -> TextGraphSpec:
    """The :class:`TextGraphSpec` of a text encoder (module docstring).

    Raises
    ------
    ConfigError
        The encoder is neither a sentence-transformers encoder nor has ``onnx_text_spec()``.
    """
    from ghofl.client.encoders.text import SentenceTransformerEncoder

    if isinstance(encoder, SentenceTransformerEncoder):
        return sentence_transformer_spec(encoder.load(), getattr(encoder, "normalize", True))
    hook = getattr(encoder, "onnx_text_spec", None)
    if callable(hook):
        spec = hook()
        if not isinstance(spec, TextGraphSpec):
            raise ConfigError(f"{type(encoder).__name__}.onnx_text_spec() must return a "
                              f"TextGraphSpec; got {type(spec).__name__}")
        return spec
    raise ConfigError(
        f"the text encoder {encoder.name!r} has no ONNX export (it is not a sentence-"
        "transformers model and has no onnx_text_spec()); export the head alone with --head-only"
    )


def _pooled(spec: TextGraphSpec) -> Any:
    """The torch module body + pooling + normalisation."""
    import torch

    class _Pooled(torch.nn.Module):
        def __init__(self, body: Any) -> None:
            super().__init__()
            self.body = body

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            tokens = self.body(input_ids, attention_mask)
            if spec.pooling == "cls":
                x = tokens[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
                x = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if spec.normalize:
                x = x / x.norm(p=2, dim=1, keepdim=True).clamp(min=1e-12)
            return x

    return _Pooled(spec.body).eval()


def text_encoder_onnx(spec: TextGraphSpec) -> onnx.ModelProto:
    """Export body + pooling + normalisation as one ONNX model (module docstring).

    Traced on padded probe sentences (so the attention-mask path is kept), with dynamic N and
    L; written to a temporary folder and loaded back.
    """
    require_extra("torch", "torch")
    require_extra("onnx", "torch")
    import warnings

    import onnx
    import torch

    feats = tokenize(spec.tokenizer, ["a probe sentence to trace the graph", "short"])
    args = tuple(torch.from_numpy(feats[k]) for k in TEXT_INPUTS)
    axes = {k: {0: "N", 1: "L"} for k in TEXT_INPUTS}
    axes[EMBEDDING_NAME] = {0: "N"}
    with tempfile.TemporaryDirectory(prefix="ghofl-text-export-") as tmp:
        path = os.path.join(tmp, "encoder.onnx")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings on shape-dependent branches
            torch.onnx.export(_pooled(spec), args, path, input_names=list(TEXT_INPUTS),
                              output_names=[EMBEDDING_NAME], dynamic_axes=axes,
                              opset_version=TEXT_OPSET, dynamo=False, do_constant_folding=True)
        return onnx.load(path)


def check_text_export(model: onnx.ModelProto, spec: TextGraphSpec, encoder: Encoder,
                      texts: Sequence[str] = PROBE_TEXTS, atol: float = 1e-4) -> float:
    """Check the tokenizer and the exported graph against the encoder on ``texts``.

    Returns
    -------
    float
        The largest absolute difference between the graph's and the encoder's embeddings.

    Raises
    ------
    ConfigError
        The tokenizer's ids differ from the encoder's own tokenization, or the embeddings
        differ by more than ``atol``.
    """
    require_extra("onnxruntime", "torch")
    import onnxruntime as ort

    texts = list(texts)
    feats = tokenize(spec.tokenizer, texts)
    if spec.reference is not None:
        ref = spec.reference(texts)
        for key in TEXT_INPUTS:
            if not np.array_equal(np.asarray(ref[key], dtype=np.int64), feats[key]):
                raise ConfigError(
                    f"the exported tokenizer's {key} differ from the encoder "
                    f"{encoder.name!r}'s own tokenization; this encoder cannot be exported as "
                    "one graph; export the head alone with --head-only"
                )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = min(4, os.cpu_count() or 1)
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    (got,) = sess.run([EMBEDDING_NAME], feats)
    diff = float(np.max(np.abs(got - encoder.embed(texts))))
    if not diff <= atol:
        raise ConfigError(
            f"the exported graph of the encoder {encoder.name!r} differs from the encoder by "
            f"{diff:.3g} (> {atol}) on probe sentences; export the head alone with --head-only"
        )
    return diff
