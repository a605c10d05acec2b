"""``--encoder-file``: the model file, folder or weights of a user's own encoder.

Taken by ``ghofl predict``, ``ghofl evaluate`` and ``ghofl export`` for a model fitted on
statistics of a user's own model file (see :mod:`ghofl.client.encoders.recorded`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["EncoderFileOption"]

#: ``encoder_file: EncoderFileOption = None`` in a command's signature.
EncoderFileOption = Annotated[Path | None, typer.Option(
    "--encoder-file", help="The model file of an onnx:/torchscript: encoder, the model folder "
    "of an hf: encoder or the weights file of a timm:/open_clip: encoder, when it is not where "
    "the model looks (the recorded name, e.g. net, net.onnx or my-bert, in the current or the "
    "model directory); its fingerprint must be the recorded one.")]
