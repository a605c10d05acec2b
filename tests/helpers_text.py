"""A tiny sentence-transformers model built locally (no download): BERT, 1 layer, d = 16.

Transformer (a WordPiece vocabulary of a few words and letters, lower-casing, ``max_seq_length``
tokens) + mean Pooling + Normalize, saved to a folder that
:class:`~ghofl.client.encoders.text.SentenceTransformerEncoder` loads.
"""

from __future__ import annotations

import string
from pathlib import Path

#: Words of the tiny vocabulary (everything else falls back to letters or [UNK]).
TINY_WORDS = ("match", "goal", "team", "score", "pizza", "bread", "cheese", "soup", "laptop",
              "code", "chip", "network", "the", "a", "and", "of", "new", "late")
TINY_DIM = 16


def build_tiny_sentence_transformer(folder: Path, *, max_seq_length: int = 12,
                                    seed: int = 0) -> Path:
    """Write the tiny model to ``folder`` (created) and return it."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import BertConfig, BertModel, BertTokenizer

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = [*special, *TINY_WORDS, *letters, *(f"##{c}" for c in string.ascii_lowercase)]
    raw = folder / "bert"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=TINY_DIM, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    bert = BertModel(config)
    bert.eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():  # untrained LayerNorms (weight 1, bias 0) put every mean-pooled
        for name, param in bert.named_parameters():  # vector on the plane sum(x) = 0
            if "LayerNorm" in name:
                param.add_(torch.randn_like(param), alpha=0.5)
    bert.save_pretrained(raw)
    BertTokenizer(vocab=str(raw / "vocab.txt"), do_lower_case=True).save_pretrained(raw)
    transformer = Transformer(str(raw), max_seq_length=max_seq_length)
    model = SentenceTransformer(modules=[transformer, Pooling(TINY_DIM, "mean"), Normalize()],
                                device="cpu")
    out = folder / "model"
    model.save(str(out))
    return out
