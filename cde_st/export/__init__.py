"""Exports of a model for other runtimes: :func:`export_onnx` (``cde-st-convert MODEL OUT --to onnx``)."""

from cde_st.export.onnx_export import QUANTIZATIONS, export_onnx

__all__ = ["QUANTIZATIONS", "export_onnx"]
