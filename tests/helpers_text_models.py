"""Tiny Hugging Face text models written in a temporary folder for the ``hf:`` encoder tests.

Import after ``pytest.importorskip("transformers")``: ``from tests.helpers_text_models import
...``. :func:`tiny_bert` saves a seeded 1-layer BERT (hidden size 16) with a WordPiece
tokenizer whose vocabulary is written next to it; :func:`tiny_sentence_transformer` wraps one
in sentence-transformers' Transformer + Pooling modules. Nothing is downloaded.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

#: words of the tiny vocabulary (after the special tokens and the letters)
WORDS = ("the", "a", "cat", "dog", "bird", "fish", "red", "blue", "green", "runs", "sleeps",
         "sings", "swims", "##s", "##ing")
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
HIDDEN = 16


def vocabulary(extra: tuple[str, ...] = ()) -> list[str]:
    """Special tokens, a-z, :data:`WORDS` and ``extra``."""
    return [*SPECIAL, *"abcdefghijklmnopqrstuvwxyz", *WORDS, *extra]


def wordpiece_tokenizer(vocab_file: Path) -> BertTokenizerFast:
    """A lower-casing WordPiece tokenizer of ``vocab_file`` (transformers 4 and 5)."""
    params = inspect.signature(BertTokenizerFast.__init__).parameters
    key = "vocab_file" if "vocab_file" in params else "vocab"
    tokenizer = BertTokenizerFast(**{key: str(vocab_file)}, do_lower_case=True)
    assert tokenizer.tokenize("the cats") == ["the", "cat", "##s"], "the vocabulary was not read"
    return tokenizer


def tiny_bert(folder: Path, seed: int = 0, *, extra_words: tuple[str, ...] = (),
              max_positions: int = 64) -> Path:
    """Save a seeded tiny BERT and its tokenizer in ``folder`` (``save_pretrained``)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(extra_words)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = wordpiece_tokenizer(folder / "vocab.txt")
    config = BertConfig(vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=max_positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_sentence_transformer(folder: Path, bert: Path, pooling: str = "mean") -> Path:
    """Save a sentence-transformers folder: ``bert`` + a ``pooling`` Pooling module."""
    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling, Transformer  # type: ignore[no-redef]
    from sentence_transformers import SentenceTransformer

    transformer = Transformer(str(bert), max_seq_length=32)
    model = SentenceTransformer(modules=[transformer, Pooling(HIDDEN, pooling_mode=pooling)],
                                device="cpu")
    model.save(str(folder))
    return folder
