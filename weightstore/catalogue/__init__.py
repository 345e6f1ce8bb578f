"""Metadata-only reading of ONNX models: structure and payload locations, no bytes."""
