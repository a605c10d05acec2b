"""``ghofl export``: one head of a model directory as an ONNX file."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer

from ghofl.cli._encoder_file import EncoderFileOption
from ghofl.cli.app import app
from ghofl.cli.predict import HEAD_HELP, AllowUnsignedModelOption, pick_head
from ghofl.model.directory import UnsignedModelWarning


@app.command("export")
def export(
    model_dir: Annotated[Path, typer.Argument(help="Model directory written by `ghofl fit`.")],
    head: Annotated[str | None, typer.Option("--head", help=HEAD_HELP)] = None,
    *,
    out: Annotated[Path, typer.Option("--out", help="ONNX file to write (FILE.onnx).")],
    head_only: Annotated[bool, typer.Option(
        "--head-only", help="Export the head alone: input 'embeddings' float32 (N, d), the "
        "encoder's output (the only choice for encoders without an ONNX path).")] = False,
    image_size: Annotated[str | None, typer.Option(
        "--image-size", help="Full graph: H or HxW of the uint8 images fed (default: the "
        "encoder's resolution); only the batch axis is dynamic.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out.")] = False,
    encoder_file: EncoderFileOption = None,
    allow_unsigned_model: AllowUnsignedModelOption = False,
) -> None:
    """Export a head as one ONNX graph.

    From the images (built-in image encoders and onnx:/torchscript: model files, whose file
    is --encoder-file or looked up by its recorded name), the token ids (text encoders,
    minilm or hf:, whose model folder is --encoder-file or looked up by its recorded name;
    the tokenizer is written beside as FILE.tokenizer.json) or, with --head-only, from
    embeddings, through the feature transform, projection and head to the outputs
    'probabilities' float32 (N, C) and 'label' int64 (N,). Classes, head, encoder
    fingerprint and input contract are recorded in the file's metadata.
    """
    from ghofl.model.export import export_model, parse_image_size

    size = None if image_size is None else parse_image_size(image_size)
    from ghofl.errors import InputError

    if head_only and size is not None:
        raise InputError("--image-size applies to the full graph only; drop it with "
                         "--head-only")
    if head_only and encoder_file is not None:
        raise InputError("--encoder-file applies to the full graph only; drop it with "
                         "--head-only")
    why = None
    if head is None:
        from ghofl.model.directory import load_model as load

        with warnings.catch_warnings():  # export_model warns once about an unsigned model
            warnings.simplefilter("ignore", UnsignedModelWarning)
            head, _, why = pick_head(load(model_dir, allow_unsigned=allow_unsigned_model,
                                          missing_ok=True), None, model_dir)
    path = export_model(model_dir, head, out, head_only=head_only, force=force,
                        image_size=size, encoder_file=encoder_file,
                        allow_unsigned=allow_unsigned_model)
    kind = "head-only graph (input: embeddings)" if head_only else "encoder + head graph"
    from ghofl.model.directory import load_model
    from ghofl.model.export_text import is_text_encoder, tokenizer_path

    with warnings.catch_warnings():  # export_model warned once about an unsigned model
        warnings.simplefilter("ignore", UnsignedModelWarning)
        model = load_model(model_dir, allow_unsigned=allow_unsigned_model)
    text = not head_only and is_text_encoder(model.head(head).meta_.encoder)
    kind = "text encoder + head graph (inputs: input_ids, attention_mask)" if text else kind
    typer.echo(f"wrote {path} ({kind}, head {head})")
    if why is not None:
        typer.echo(why, err=True)
    if text:
        typer.echo(f"wrote {tokenizer_path(path)} (its tokenizer, for tokenizers.Tokenizer)")
