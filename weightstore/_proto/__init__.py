"""The scenario messages of ``schemas/weightstore.proto``.

``descriptor.py`` is generated, never edited by hand: change the schema and run
``python tools/generate_proto.py``. ``weightstore_pb2`` builds the message classes
from it at run time; they embed onnx's own classes (``onnx.NodeProto``,
``onnx.TensorProto``, ...), imported from ``onnx.onnx_ml_pb2``.
"""
