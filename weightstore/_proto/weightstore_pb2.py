"""The scenario message classes, built at run time from the committed descriptor.

``descriptor.py`` holds the serialized ``FileDescriptorProto`` of
``schemas/weightstore.proto`` (the source of truth; regenerate with
``python tools/generate_proto.py``). The classes come from protobuf's public
``descriptor_pool`` and ``message_factory``, not from generated code, so no protobuf
runtime version is baked in: any protobuf onnx accepts will do. The schema imports
``onnx/onnx-ml.proto``, which onnx's own module registers first (loaded by
:mod:`weightstore.io.onnx_proto`, without the rest of onnx), so the messages embed
onnx's classes (``onnx.NodeProto``, ``onnx.TensorProto``, ...).
"""

from __future__ import annotations

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

from ..io import onnx_proto  # noqa: F401  registers the file ours imports
from .descriptor import FILE_NAME, SERIALIZED

_POOL = descriptor_pool.Default()


def _file() -> object:
    """The schema's FileDescriptor, added to the default pool once."""
    try:
        return _POOL.FindFileByName(FILE_NAME)
    except KeyError:
        _POOL.AddSerializedFile(SERIALIZED)
        return _POOL.FindFileByName(FILE_NAME)


def _message_class(name: str) -> type[Message]:
    """The class of message ``weightstore.<name>``, importable from this module (so
    messages pickle)."""
    desc = _POOL.FindMessageTypeByName(f"weightstore.{name}")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.21
        cls = message_factory.GetMessageClass(desc)
    else:
        cls = message_factory.MessageFactory(_POOL).GetPrototype(desc)
    cls.__module__ = __name__
    return cls


DESCRIPTOR = _file()
LocalRewritingProto = _message_class("LocalRewritingProto")
ModelModificationScenarioProto = _message_class("ModelModificationScenarioProto")
ModelScenarios = _message_class("ModelScenarios")

__all__ = ["DESCRIPTOR", "LocalRewritingProto", "ModelModificationScenarioProto",
           "ModelScenarios"]
