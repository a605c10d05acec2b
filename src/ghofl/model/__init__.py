"""The fitted model in use: its directory on disk, its card, and its ONNX export.

:mod:`ghofl.model.directory` writes and reads a model directory (heads, manifest, OOD score);
:mod:`ghofl.model.card` renders its ``README.md``; :mod:`ghofl.model.export` (with
:mod:`~ghofl.model.export_file`, :mod:`~ghofl.model.export_text` and
:mod:`~ghofl.model.onnx_graph`) writes one ONNX graph from raw input to labels. The heads
themselves, as estimators, live in :mod:`ghofl.heads`. Nothing is imported here, so importing
one submodule does not load the others.
"""
