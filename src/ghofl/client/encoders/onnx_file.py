"""``onnx:PATH``: any ONNX image model with a (batch, d) output, run by ONNX Runtime.

The model's input is read from the file: its element type (float32, float16 or uint8) is the
contract's ``dtype``, a static channel axis of 3 gives the ``layout`` (else NCHW for float and
NHWC for uint8 inputs), and a static height and width give the ``size``. The input contract
(:mod:`ghofl.client.encoders.contract`) states the rest (normalisation) and must agree with
what the file fixes. A model with several inputs or outputs needs ``input`` / ``output``. The
graph is run on the CPU with every optimisation on; models saved with external data files are
hashed by their ``.onnx`` file only.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.contract import CONTRACT_KEYS, InputContract, resolve_contract
from ghofl.client.encoders.model_file import ImageFileEncoder
from ghofl.errors import ConfigError, require_extra

__all__ = ["OnnxFileEncoder"]

_ONNX_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(uint8)": "uint8"}


def _pick(items: list[Any], wanted: str | None, what: str, where: str) -> Any:
    names = [t.name for t in items]
    if wanted is not None:
        if wanted not in names:
            raise ConfigError(f"{where} has no {what} named {wanted!r}; its {what}s are "
                              f"{', '.join(names)}")
        return items[names.index(wanted)]
    if len(items) != 1:
        raise ConfigError(f"{where} has {len(items)} {what}s ({', '.join(names)}); name the one "
                          f"to use with the contract key {what!r}")
    return items[0]


def _static(dim: Any) -> int | None:
    return int(dim) if isinstance(dim, int) and dim > 0 else None


class OnnxFileEncoder(ImageFileEncoder):
    """An ONNX image model file as an encoder (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.onnx`` file.
    resolution : int, default 224
        Input size of a float model with a dynamic height and width and no ``size``.
    contract : mapping, path or None
        Input contract; ``None``: the JSON beside the model, if any.
    threads : int or None
        ONNX Runtime intra-op threads; ``None`` uses ``os.cpu_count()``.
    **options
        Contract keys (see :mod:`ghofl.client.encoders.contract`).
    """

    kind = "onnx"
    keys = CONTRACT_KEYS

    def __init__(self, path: str | os.PathLike[str], *, threads: int | None = None,
                 **kw: Any) -> None:
        self.threads = int(threads) if threads else (os.cpu_count() or 1)
        self._input = self._output = ""
        super().__init__(path, **kw)

    def _load(self) -> Any:
        require_extra("onnxruntime", "torch")
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        try:
            return ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(f"ONNX Runtime cannot load '{self.path}' ({first}); give a valid "
                              ".onnx model file") from exc

    def _resolve(self, values: dict[str, Any], resolution: int) -> InputContract:
        where = self._where()
        inp = _pick(self.model.get_inputs(), values.get("input"), "input", where)
        out = _pick(self.model.get_outputs(), values.get("output"), "output", where)
        self._input, self._output = inp.name, out.name
        if out.shape is not None and len(out.shape) != 2:
            raise ConfigError(
                f"{where} output {out.name!r} has rank {len(out.shape)} (shape {out.shape}); "
                "ghofl needs embeddings of shape (batch, d): export the model with its pooling "
                "and flattening included, or name a (batch, d) output with the key 'output'")
        return resolve_contract(self._input_facts(inp, values), resolution,
                                f"input contract of {where}")

    def _input_facts(self, inp: Any, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with dtype, layout and size filled from (and checked against) the input."""
        where = f"input {inp.name!r} of {self._where()}"
        dtype = _ONNX_TYPES.get(inp.type)
        if dtype is None:
            raise ConfigError(f"{where} has type {inp.type}; ghofl feeds float32, float16 or "
                              "uint8 images")
        if values.get("dtype", dtype) != dtype:
            raise ConfigError(f"the input contract says dtype {values['dtype']} but {where} "
                              f"takes {dtype}; set dtype to {dtype} or drop it")
        shape = list(inp.shape or [])
        if len(shape) != 4:
            raise ConfigError(f"{where} has shape {inp.shape}; an image model takes a 4-d "
                              "batch (NCHW or NHWC)")
        c1, c3 = _static(shape[1]), _static(shape[3])
        layout = values.get("layout") or ("NCHW" if c1 == 3 else "NHWC" if c3 == 3
                                          else "NHWC" if dtype == "uint8" else "NCHW")
        chan, other, hw = (c1, c3, shape[2:4]) if layout == "NCHW" else (c3, c1, shape[1:3])
        if (chan is not None and chan != 3) or (chan is None and other == 3):
            raise ConfigError(f"the input contract says layout {layout} but {where} has shape "
                              f"{inp.shape} (its channel axis of 3 is elsewhere); set the "
                              "layout that matches the model or drop it")
        static = (_static(hw[0]), _static(hw[1]))
        size = values.get("size")
        if None not in static:
            if size is not None and tuple(size) != static:
                raise ConfigError(f"the input contract says size {size[0]}x{size[1]} but "
                                  f"{where} takes {static[0]}x{static[1]}; set size to "
                                  f"[{static[0]}, {static[1]}] or drop it")
            size = static
        return {**values, "dtype": dtype, "layout": layout,
                **({"size": size} if size is not None else {})}

    def _describe(self) -> str:
        return f"{self.contract.describe()}; onnx {self._input!r} -> {self._output!r}"

    def _error_text(self, exc: BaseException) -> str:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return lines[0][:300] if lines else type(exc).__name__

    def _run(self, x: NDArray[Any]) -> NDArray[Any]:
        (out,) = self.model.run([self._output], {self._input: x})
        return np.asarray(out)
