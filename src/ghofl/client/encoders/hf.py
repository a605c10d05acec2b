"""``hf:NAME_OR_DIR``: a Hugging Face text model as a sentence encoder (``text`` extra).

``NAME_OR_DIR`` is a local folder or a Hugging Face hub id (``ORG/NAME``):

* A **sentence-transformers folder** (it holds ``modules.json``) runs through
  ``sentence_transformers.SentenceTransformer.encode`` with the folder's own modules (its
  pooling, any ``Dense``/``Normalize``), then L2 normalisation (``normalize=True``, the default).
* A **plain transformers folder** (``config.json``, weights, tokenizer, as written by
  ``save_pretrained``) runs ``AutoTokenizer`` + ``AutoModel``; the sentence embedding is the
  attention-mask mean of the last hidden states (``pooling="mean"``, the default; ``"cls"``: the
  first token's), L2-normalised by default (``normalize=False`` keeps the raw pooled vector).
  Inputs longer than ``max_length`` tokens are truncated (default: the tokenizer's limit, capped
  by the model's ``max_position_embeddings``).
* A **hub id** is looked up in the local Hugging Face cache (a cached snapshot is used as it is,
  without network) and, when it is not there, downloaded there once (config, tokenizer and
  weight files only). With ``HF_HUB_OFFLINE=1`` or when the hub does not answer, an id that is
  not cached fails with one line naming the fix (:mod:`ghofl.client.encoders.hub`).

The fingerprint (:class:`~ghofl.stats.meta.EncoderInfo`) covers the content of the folder's
model files (weights, config, tokenizer, sentence-transformers module configs; not READMEs nor
other runtimes' exports such as ``onnx/``): ``weights_hash`` is the SHA-256 over their relative
paths and SHA-256s. ``preprocessing`` records the pooling, the normalisation and the maximum
length; the name is ``hf:`` plus the hub id or the folder's name, so clients whose copies of
one model sit at different paths agree.

No default clipping bound: :func:`~ghofl.client.encoders.default_clip_norm` returns ``None``.
With ``normalize=True`` the embeddings are unit vectors, so 1.01 bounds them without a feature
transform.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any

from ghofl.client.encoders.text import (
    SentenceTransformerEncoder,
    TextEncoder,
    sentence_embedding_dim,
)
from ghofl.errors import ConfigError, DataError, require_extra
from ghofl.stats.meta import EncoderInfo

__all__ = ["HF_POOLINGS", "TransformersEncoder", "folder_digest", "hf_encoder",
           "resolve_model_folder"]

#: pooling of a plain transformers model: attention-mask mean, or the first (CLS) token
HF_POOLINGS = ("mean", "cls")
#: files fetched from the hub for an id (every model, tokenizer and module config and weights)
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.safetensors", "*.bin"]
_SKIP_DIRS = frozenset({"onnx", "openvino", ".git", ".cache", "__pycache__"})
_SKIP_SUFFIXES = frozenset({".md", ".onnx", ".h5", ".msgpack", ".ot", ".xml", ".py", ".pyc",
                            ".lock"})
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_FIX = ("pass a local model folder instead (--encoder hf:/path/to/folder, saved with "
        "save_pretrained)")


def _model_files(folder: Path) -> list[Path]:
    """The files of ``folder`` that define the model (weights, configs, tokenizer), sorted.

    In a folder that holds ``.safetensors`` weights, ``.bin`` files are skipped (the loaders
    prefer safetensors).
    """
    files: list[Path] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if not path.is_file() or any(p in _SKIP_DIRS or p.startswith(".") for p in rel.parts):
            continue
        if path.suffix.lower() in _SKIP_SUFFIXES or path.name.lower().startswith("readme"):
            continue
        if path.suffix == ".bin" and any(path.parent.glob("*.safetensors")):
            continue
        files.append(path)
    return files


def folder_digest(folder: str | os.PathLike[str]) -> str:
    """SHA-256 over the relative paths and SHA-256s of a model folder's files (hex).

    Parameters
    ----------
    folder : str or os.PathLike
        A transformers or sentence-transformers model folder.

    Returns
    -------
    str
        64 hex digits; another weight, config or tokenizer file gives another digest.
    """
    from ghofl.client.encoders.efficientnet_lite import sha256_file

    root = Path(folder)
    h = hashlib.sha256()
    for path in _model_files(root):
        h.update(f"{path.relative_to(root).as_posix()}\t{sha256_file(path)}\n".encode())
    return h.hexdigest()


def _check_model_folder(folder: Path) -> None:
    if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
        raise DataError(
            f"'{folder}' is not a transformers or sentence-transformers model folder (it holds "
            "neither config.json nor modules.json); give the folder written by "
            "model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR), or by "
            "SentenceTransformer.save(DIR)")
    names = {p.name for p in _model_files(folder)}
    if not any(n.endswith((".safetensors", ".bin")) for n in names):
        raise DataError(
            f"model folder '{folder}' holds no weights file (.safetensors or .bin); save the "
            "model into it with model.save_pretrained(DIR)")


def _hub_snapshot(repo_id: str) -> Path:
    """The cached snapshot folder of hub model ``repo_id``, downloaded once when online.

    The local cache first; a download only when the snapshot is not cached, downloads are on
    and the hub answers (:func:`~ghofl.client.encoders.hub.cache_first`).
    """
    require_extra("huggingface_hub", "text")
    from huggingface_hub import snapshot_download

    from ghofl.client.encoders.hub import cache_first

    def download(local_only: bool) -> Path:
        return Path(snapshot_download(repo_id, local_files_only=local_only,
                                      allow_patterns=HUB_PATTERNS))

    try:
        return cache_first(download, f"Hugging Face hub model '{repo_id}' is", _FIX,
                           download=f"hf download {repo_id}")
    except DataError:
        raise
    except Exception as exc:
        raise DataError(
            f"could not get Hugging Face hub model '{repo_id}' ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); check the id and the "
            f"network, or {_FIX}") from exc


def resolve_model_folder(spec: str) -> tuple[Path, str]:
    """The model folder of ``hf:SPEC`` and the encoder name to record.

    Parameters
    ----------
    spec : str
        A local folder (an existing path, or one starting with ``/``, ``.`` or ``~``) or a hub id.

    Returns
    -------
    (Path, str)
        The folder, and ``hf:<folder name>`` (local) or ``hf:<hub id>``.

    Raises
    ------
    ConfigError
        An empty spec.
    DataError
        A missing folder, a file, a folder that holds no model, or a hub id not cached offline.
    """
    text = str(spec).strip()
    if not text:
        raise ConfigError("encoder 'hf:' needs a model folder or a Hugging Face hub id, e.g. "
                          "hf:sentence-transformers/all-MiniLM-L6-v2 or hf:./my-model")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DataError(f"'{path}' is a file; hf: takes a model folder (config.json, weights "
                            "and tokenizer files) or a Hugging Face hub id")
        _check_model_folder(path)
        return path, f"hf:{path.resolve().name}"
    if text.startswith(("/", ".", "~")) or "\\" in text or not _HUB_ID.fullmatch(text):
        raise DataError(f"model folder '{path}' does not exist; give an existing model folder "
                        "(hf:DIR, saved with save_pretrained) or a Hugging Face hub id "
                        "(hf:ORG/NAME)")
    folder = _hub_snapshot(text)
    _check_model_folder(folder)
    return folder, f"hf:{text}"


class TransformersEncoder(TextEncoder):
    """A plain transformers model folder as a sentence encoder (see the module docstring).

    Parameters
    ----------
    model_dir : str or os.PathLike
        The folder (``config.json``, weights, tokenizer files).
    name : str
        Encoder name recorded in :attr:`info`.
    batch_size : int, default 64
        Sentences per forward pass.
    max_length : int or None
        Truncation length in tokens; ``None``: the tokenizer's limit, capped by the model's
        ``max_position_embeddings`` (512 when neither gives one).
    pooling : {"mean", "cls"}, default "mean"
        Attention-mask mean of the last hidden states, or the first token's state.
    normalize : bool, default True
        L2-normalise the pooled vectors.
    """

    def __init__(self, model_dir: str | os.PathLike[str], *, name: str, batch_size: int = 64,
                 max_length: int | None = None, pooling: str = "mean",
                 normalize: bool = True) -> None:
        require_extra("transformers", "text")
        require_extra("torch", "text")
        if pooling not in HF_POOLINGS:
            raise ConfigError(f"pooling must be one of {', '.join(HF_POOLINGS)}; got {pooling!r}")
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be a positive integer; got {batch_size!r}")
        self.model_dir = Path(model_dir)
        self.batch_size, self.pooling, self.normalize = int(batch_size), pooling, bool(normalize)
        self._model: Any = None
        tokenizer, model = self.load()
        self.max_length = self._max_length(max_length, tokenizer, model.config)
        dim = int(self._encode(["ghofl"]).shape[1])
        self._info = EncoderInfo(name, dim, folder_digest(self.model_dir), self._describe())

    @staticmethod
    def _max_length(given: int | None, tokenizer: Any, config: Any) -> int:
        limit = min(float(getattr(tokenizer, "model_max_length", math.inf) or math.inf),
                    float(getattr(config, "max_position_embeddings", math.inf) or math.inf))
        limit = 512.0 if limit > 1e6 else limit
        if given is None:
            return int(limit)
        if int(given) < 1 or int(given) > limit:
            raise ConfigError(f"max_length must be an integer in [1, {int(limit)}] (the model's "
                              f"limit); got {given!r}")
        return int(given)

    def _describe(self) -> str:
        pool = ("attention-mask mean pooling of last_hidden_state" if self.pooling == "mean"
                else "first-token (CLS) pooling of last_hidden_state")
        norm = "L2 normalisation" if self.normalize else "no normalisation"
        return (f"transformers AutoTokenizer (truncation to max_length={self.max_length}, "
                f"padding) + AutoModel; {pool}; {norm}")

    def _load_model(self) -> Any:
        from transformers import AutoModel, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
            model = AutoModel.from_pretrained(str(self.model_dir))
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(
                f"could not load the transformers model in '{self.model_dir}' "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                "the folder needs config.json, the weights and the tokenizer files, as written "
                "by model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)") from exc
        return tokenizer, model.eval()

    def _encode(self, texts: list[str]) -> Any:
        import torch
        import torch.nn.functional as F

        tokenizer, model = self.load()
        outs = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = tokenizer(texts[i:i + self.batch_size], padding=True, truncation=True,
                                max_length=self.max_length, return_tensors="pt")
                hidden = model(**enc).last_hidden_state
                if self.pooling == "mean":
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                else:
                    pooled = hidden[:, 0]
                if self.normalize:
                    pooled = F.normalize(pooled, p=2, dim=1)
                outs.append(pooled.float())
        return torch.cat(outs).numpy()

    def onnx_text_spec(self) -> Any:
        """What ``ghofl export`` needs for the full text graph (a ``TextGraphSpec``).

        The model's last hidden states, this encoder's pooling and normalisation, and its fast
        tokenizer with the truncation length and padding set, checked against the
        tokenizer's own output before export.
        """
        from ghofl.client.encoders.text_onnx import TextGraphSpec, export_tokenizer, hf_body

        tok, model = self.load()
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError(f"the tokenizer of '{self.model_dir}' is not a fast (tokenizers) "
                              "tokenizer, so it cannot be written beside the ONNX file; export "
                              "the head alone with --head-only")
        length = self.max_length

        def reference(texts: list[str]) -> dict[str, Any]:
            return dict(tok(texts, padding=True, truncation=True, max_length=length,
                            return_tensors="np"))

        return TextGraphSpec(
            hf_body(model),
            export_tokenizer(backend, length, pad_id=int(tok.pad_token_id or 0),
                             pad_token=str(tok.pad_token), padding_side=tok.padding_side,
                             truncation_side=tok.truncation_side),
            length, self.pooling, self.normalize, reference=reference)

    def __repr__(self) -> str:
        return f"TransformersEncoder(name={self.name!r}, dim={self.dim})"


class _HFSentenceTransformerEncoder(SentenceTransformerEncoder):
    """A sentence-transformers folder with the ``hf:`` fingerprint (every model file)."""

    def __init__(self, model_dir: Path, *, name: str, batch_size: int,
                 max_length: int | None, normalize: bool) -> None:
        super().__init__(model_dir, name=name, batch_size=batch_size, max_length=max_length,
                         normalize=normalize)
        model = self.load()
        modules = ", ".join(type(m).__name__ for m in model)
        norm = "L2 normalisation" if self.normalize else "no normalisation"
        desc = (f"sentence-transformers encode: modules {modules}; "
                f"max_seq_length={model.max_seq_length}; {norm}")
        self._info = EncoderInfo(name, sentence_embedding_dim(model),
                                 folder_digest(model_dir), desc)

    def __repr__(self) -> str:
        return f"SentenceTransformerEncoder(name={self.name!r}, dim={self.dim}, hf=True)"


def hf_encoder(spec: str, *, batch_size: int = 64, max_length: int | None = None,
               pooling: str | None = None, normalize: bool = True) -> TextEncoder:
    """The encoder of ``hf:SPEC`` (module docstring).

    Parameters
    ----------
    spec : str
        A local model folder or a Hugging Face hub id.
    batch_size : int, default 64
        Sentences per forward pass.
    max_length : int or None
        Truncation length in tokens; ``None``: the model's.
    pooling : {"mean", "cls"} or None
        Plain transformers folders only (default ``"mean"``); a sentence-transformers folder
        uses its own pooling module.
    normalize : bool, default True
        L2-normalise the embeddings.

    Returns
    -------
    TextEncoder
        The model, loaded on the CPU; its ``info`` fingerprints the folder's model files and
        the preprocessing.

    Raises
    ------
    ConfigError
        A bad option (``pooling`` for a sentence-transformers folder, a ``max_length`` over
        the model's limit).
    DataError
        A missing or unusable folder, or a hub id that is not cached while offline.
    MissingExtraError
        Without the ``text`` extra.
    """
    require_extra("transformers", "text")
    folder, name = resolve_model_folder(spec)
    if (folder / "modules.json").is_file():
        if pooling is not None:
            raise ConfigError(
                f"'{folder}' is a sentence-transformers folder, which pools with its own "
                "Pooling module; drop the pooling option (or edit its 1_Pooling/config.json)")
        return _HFSentenceTransformerEncoder(folder, name=name, batch_size=batch_size,
                                             max_length=max_length, normalize=normalize)
    return TransformersEncoder(folder, name=name, batch_size=batch_size, max_length=max_length,
                               pooling=pooling or "mean", normalize=normalize)
