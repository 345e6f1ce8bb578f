"""Protobuf code generated from ``schemas/weightstore.proto``.

``weightstore_pb2`` is generated, never edited by hand: change the schema and run
``python -m weightstore._proto.generate``. Its messages embed onnx's own classes
(``onnx.NodeProto``, ``onnx.TensorProto``, ...), imported from ``onnx.onnx_ml_pb2``.
"""
