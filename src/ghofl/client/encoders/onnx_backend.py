"""ONNX Runtime backend: export a torch encoder module once, cache the file, run it fast.

The exported graph holds the whole encoder (dtype cast, resize, normalisation, network,
pooling), so the session is fed the decoded uint8 images directly. The file is cached under
``<cache dir>/onnx/<name>-<fingerprint>-<H>x<W>-<dtype>.onnx`` (cache dir: ``GHOFL_CACHE_DIR``,
default ``~/.cache/ghofl``); the input height/width are part of the key because only the batch
axis is dynamic. Features match eager PyTorch to ~1e-5, so the encoder keeps the same
:class:`~ghofl.stats.meta.EncoderInfo` (and fingerprint) as the torch backend.

Attention layers (``torch.nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``, as in
open_clip's and torchvision's vision transformers) are exported through their composite path:
in eval mode without gradients PyTorch would call its fused kernel
``aten::_native_multi_head_attention``, which the TorchScript-based exporter cannot convert, so
the fused "fast path" is switched off while the module is traced (:func:`mha_slow_path`). Both
paths compute the same attention; eager runs keep the fused kernel.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import InfoEncoder, as_image_batch, check_embeddings
from ghofl.errors import require_extra
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import torch

__all__ = ["OnnxEncoder", "export_onnx", "mha_slow_path"]

OPSET = 17


@contextlib.contextmanager
def mha_slow_path() -> Iterator[None]:
    """Within the block, attention layers use their exportable composite path.

    Switches off ``torch.backends.mha`` fast path (the fused
    ``aten::_native_multi_head_attention`` / ``_transformer_encoder_layer_fwd`` kernels that
    ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` call in eval mode) and
    restores the previous setting on exit.
    """
    import torch

    mha = torch.backends.mha
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(before)


def export_onnx(module: torch.nn.Module, example: NDArray[Any], path: Path) -> Path:
    """Export ``module`` (input ``x`` of shape (b, H, W, 3), dynamic batch) to ``path``.

    The file is written to a temporary name in the same folder and renamed into place, so a
    crash or a concurrent reader never sees a partial file.
    """
    require_extra("torch", "torch")
    require_extra("onnx", "torch")
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.inference_mode(), mha_slow_path():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module.eval(),
                (torch.from_numpy(example),),
                tmp,
                opset_version=OPSET,
                dynamo=False,
                input_names=["x"],
                output_names=["features"],
                dynamic_axes={"x": {0: "batch"}, "features": {0: "batch"}},
            )
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class OnnxEncoder(InfoEncoder):
    """An image encoder run by ONNX Runtime from a cached export of a torch module.

    Parameters
    ----------
    module_factory : callable
        Builds the torch module (input (b, H, W, 3) in [0, 255], output (b, dim)); called only
        when no cached export exists for an input size.
    info : EncoderInfo
        Identity of the encoder; the same as the torch backend's.
    cache_dir : str or os.PathLike or None
        Root of the cache; ``None`` uses ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``.
    threads : int or None
        ONNX Runtime intra-op threads; ``None`` uses ``os.cpu_count()``.
    """

    def __init__(
        self,
        module_factory: Callable[[], torch.nn.Module],
        info: EncoderInfo,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
    ) -> None:
        from ghofl.client.cache import default_cache_dir

        require_extra("onnxruntime", "torch")
        self._factory = module_factory
        self._info = info
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.threads = int(threads) if threads else (os.cpu_count() or 1)
        self._sessions: dict[tuple[int, int, str], Any] = {}


    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_sessions"] = {}
        return state

    def __repr__(self) -> str:
        return f"OnnxEncoder(name={self.name!r}, dim={self.dim}, backend='onnx')"

    def onnx_path(self, height: int, width: int, dtype: str = "uint8") -> Path:
        """Cache path of the export for inputs of shape (b, height, width, 3) and ``dtype``."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name)
        fname = f"{safe}-{self._info.fingerprint()}-{height}x{width}-{dtype}.onnx"
        return self.cache_dir / "onnx" / fname

    def _new_session(self, path: Path) -> Any:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def export(self, height: int, width: int, dtype: str = "uint8") -> Path:
        """Export the module for inputs (b, height, width, 3) of ``dtype`` to :meth:`onnx_path`."""
        path = self.onnx_path(height, width, dtype)
        example = np.zeros((2, height, width, 3), dtype=np.dtype(dtype))
        return export_onnx(self._factory(), example, path)

    def _build_model(self, path: Path, height: int, width: int, dtype: str) -> None:
        """Write the model file ``path`` for this input size (subclasses may transform it)."""
        self.export(height, width, dtype)

    def session(self, height: int, width: int, dtype: str = "uint8") -> Any:
        """The ONNX Runtime session for this input size, building the model file if needed."""
        key = (int(height), int(width), dtype)
        if key in self._sessions:
            return self._sessions[key]
        path = self.onnx_path(*key)
        if not path.is_file():
            self._build_model(path, *key)
        try:
            sess = self._new_session(path)
        except Exception:
            path.unlink(missing_ok=True)
            self._build_model(path, *key)
            sess = self._new_session(path)
        self._sessions[key] = sess
        return sess

    def embed(self, batch: Any) -> NDArray[np.float32]:
        """Embed images (b, H, W, 3) (uint8, or float in [0, 255]); returns float32 (b, dim)."""
        x = as_image_batch(batch, self.name)
        sess = self.session(x.shape[1], x.shape[2], str(x.dtype))
        (out,) = sess.run(["features"], {"x": x})
        return check_embeddings(out, x.shape[0], self.dim, self.name)
