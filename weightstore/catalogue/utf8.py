"""Every ``string`` field of a model must be valid UTF-8.

onnx.proto is a proto2 file: neither protobuf's parser nor onnxruntime checks that its
``string`` fields (tensor, node, graph, value and function names, inputs and outputs,
domains, external-data entries, metadata keys and values, doc strings) hold UTF-8, and
onnx's Python API hands such a field back as ``bytes`` instead of ``str``. Every JSON
document weightstore writes (summaries, manifests, records, ``inspect --json``) names
values by text, and its passes compare names as ``str``: a model whose strings are not
UTF-8 cannot be described, packaged or resolved faithfully, so every reader refuses it
here, naming the field (``TensorProto.name``) and the byte offset of the first bad byte.

The check walks the protobuf wire format with onnx.proto's descriptors: ``bytes``
fields (``raw_data``, ``string_data``, attribute values) and numbers are skipped unread.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from ..errors import ModelError
from .wire import LEN, MAX_DEPTH, Field, iter_fields


def check_field(buf: Any, f: Field, descriptor: Descriptor, depth: int = 0) -> None:
    """Refuse a ``string`` field of ``descriptor``'s message, at ``f``, that is not
    UTF-8, looking inside sub-messages too."""
    if f.wire_type != LEN:
        return
    kind = _plan(descriptor).get(f.number)
    if kind is None:
        return
    if kind is _STRING:
        data = bytes(buf[f.value:f.end])
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            name = f"{descriptor.name}.{descriptor.fields_by_number[f.number].name}"
            raise ModelError(f"{name} is not valid UTF-8 (onnx.proto strings must be)",
                             field=name, offset=f.value + exc.start,
                             value=data.decode("utf-8", "backslashreplace")) from None
    else:
        check_message(buf, f.value, f.end, kind, depth + 1)


def check_message(buf: Any, pos: int, end: int, descriptor: Descriptor,
                  depth: int = 0) -> None:
    """:func:`check_field` for every field of the message in ``buf[pos:end]``."""
    if depth > MAX_DEPTH:
        raise ModelError("messages nested deeper than the limit", offset=pos,
                         limit=MAX_DEPTH)
    for f in iter_fields(buf, pos, end):
        check_field(buf, f, descriptor, depth)


_STRING = object()


@functools.cache
def _plan(descriptor: Descriptor) -> dict[int, Any]:
    """Field number -> ``_STRING`` or the sub-message's descriptor, for the fields that
    can hold a string (``bytes`` and numeric fields are left out)."""
    plan: dict[int, Any] = {}
    for fd in descriptor.fields:
        if fd.type == FieldDescriptor.TYPE_STRING:
            plan[fd.number] = _STRING
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            plan[fd.number] = fd.message_type
    return plan
