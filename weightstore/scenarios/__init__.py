"""Modification scenarios: named, replayable rewrite sequences stored inside a model.

A scenario is an alternative to the base graph, selected before any weight is read and
replayed from metadata alone. Records live in ModelProto field 20000 (a local provisional
field, kept by onnx as an unknown field) and are bound to their base graph by a digest.
"""
