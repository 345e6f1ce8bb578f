"""The ``file-constant`` form: GE's Const -> FileConstant conversion.

An externalized Constant node becomes a ``FileConstant`` node in place (same name, same
output); an externalized initializer becomes a ``FileConstant`` node at the front of its
graph. Attributes follow GE: ``location``, ``offset``, ``length``, ``dtype``, ``shape``, and
``file_id`` holds the payload's digest key. A few extra attributes (``origin``,
``initializer_index``, ``constant_domain``, ``value_doc_string``, ``tensor_name``,
``encoding``) make the reverse conversion exact.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from ..catalogue.file_constants import (
    DOMAIN,
    OP_TYPE,
    OPSET_VERSION,
    attribute_text,
    file_constant_attributes,
    is_any_file_constant,
    is_file_constant,
)
from ..catalogue.graphs import function_label, iter_containers, iter_scoped_containers
from ..catalogue.payload import expected_nbytes
from ..errors import ConversionError
from ..io.onnx_proto import (
    AttributeProto,
    FunctionProto,
    ModelProto,
    NodeProto,
    OperatorSetIdProto,
    TensorProto,
    make_attribute,
    make_node,
)
from .encoding import set_external, set_payload
from .placement import ExternalTensor


def _attributes(ext: ExternalTensor) -> dict[str, object]:
    t = ext.site.tensor
    p = ext.placement
    attrs: dict[str, object] = {
        "location": p.location,
        "offset": p.offset,
        "length": p.length,
        "dtype": t.data_type,
        "shape": list(t.dims),
        "file_id": p.key,
        "origin": ext.site.role,
    }
    if ext.site.role == "initializer":
        attrs["initializer_index"] = ext.site.index
    elif ext.site.node is not None:
        if ext.site.node.HasField("domain"):
            attrs["constant_domain"] = ext.site.node.domain
        value = next(a for a in ext.site.node.attribute if a.name == "value")
        if value.doc_string:
            attrs["value_doc_string"] = value.doc_string
    if t.HasField("name"):
        attrs["tensor_name"] = t.name
    if ext.encoding != "raw_data":
        attrs["encoding"] = ext.encoding
    return attrs


def _make_attributes(ext: ExternalTensor) -> list[AttributeProto]:
    return [
        make_attribute(k, v, attr_type=AttributeProto.INTS) if k == "shape"
        else make_attribute(k, v)
        for k, v in _attributes(ext).items()
    ]


def can_hold(ext_site_tensor: TensorProto) -> bool:
    """FileConstant carries name, dtype, shape and payload; nothing else of the tensor."""
    t = ext_site_tensor
    return not (t.doc_string or len(t.metadata_props) or t.HasField("segment"))


def _import_domain(opsets) -> None:
    if not any(o.domain == DOMAIN for o in opsets):
        opsets.append(OperatorSetIdProto(domain=DOMAIN, version=OPSET_VERSION))


def apply_file_constant(model: ModelProto, tensors: Sequence[ExternalTensor]) -> None:
    """Turn every listed Constant node / initializer into a FileConstant node (mutates)."""
    by_container: dict[int, list[ExternalTensor]] = defaultdict(list)
    containers = {}
    for ext in tensors:
        if ext.site.role not in ("constant", "initializer"):
            raise ConversionError("only Constant nodes and initializers become FileConstant",
                                  where=ext.site.where)
        by_container[id(ext.site.container)].append(ext)
        containers[id(ext.site.container)] = ext.site.container
    # Deepest containers first, and every edit in place: rebuilding a repeated field would
    # copy its nodes and detach the subgraphs that later edits still point at.
    order = sorted(by_container, key=lambda c: -max(len(e.site.path) for e in by_container[c]))
    for cid in order:
        items = by_container[cid]
        container = containers[cid]
        for ext in items:
            if ext.site.role == "constant":
                node = ext.site.node
                attributes = _make_attributes(ext)  # read the tensor before it is cleared
                node.ClearField("attribute")
                node.op_type = OP_TYPE
                node.domain = DOMAIN
                node.attribute.extend(attributes)
        inits = sorted((e for e in items if e.site.role == "initializer"),
                       key=lambda e: e.site.index)
        new_nodes = []
        for e in inits:
            node = make_node(OP_TYPE, [], [e.site.tensor.name], name=e.site.tensor.name,
                             domain=DOMAIN)
            node.attribute.extend(_make_attributes(e))
            new_nodes.append(node)
        for e in reversed(inits):
            del container.initializer[e.site.index]
        for j, node in enumerate(new_nodes):
            container.node.insert(j, node)
        if isinstance(container, FunctionProto):
            _import_domain(container.opset_import)
    if tensors:
        _import_domain(model.opset_import)


def file_constant_locations(model: ModelProto) -> set[str]:
    """The ``location`` and ``file_path`` of every FileConstant node, as written."""
    out = set()
    for container, _ in iter_containers(model):
        for node in container.node:
            if is_any_file_constant(node):
                attrs = file_constant_attributes(node)
                for key in ("location", "file_path"):
                    if attrs.get(key):
                        out.add(attribute_text(attrs[key]))
    return out


def restore_constants(model: ModelProto,
                      read: Callable[[NodeProto, str], bytes]) -> int:
    """Reverse of :func:`apply_file_constant`: FileConstant nodes back to their origin.

    Nodes another tool made (GE) become Constant nodes. ``read(node, where)`` returns the
    payload bytes of a FileConstant node. Returns the number of nodes converted.
    """
    def inline(node: NodeProto, attrs: dict[str, object], tensor: TensorProto,
               where: str) -> None:
        data = read(node, where)
        expected = expected_nbytes(tensor.data_type, tensor.dims)
        if expected is not None and expected != len(data):
            raise ConversionError("FileConstant's bytes do not fit its dtype and shape",
                                  where=where, dtype=tensor.data_type,
                                  shape=list(tensor.dims), length=len(data),
                                  expected=expected)
        set_payload(tensor, data, attribute_text(attrs.get("encoding", b"raw_data")))

    return _restore(model, is_any_file_constant, inline)


def as_external_constants(model: ModelProto) -> int:
    """Our FileConstant nodes as what they stand for, each value external data at the
    node's own file range (nothing read): the form a runtime that does not know
    FileConstant loads, its payloads bound afterwards like any external weight. Returns
    the number of nodes turned."""
    def external(node: NodeProto, attrs: dict[str, object], tensor: TensorProto,
                 where: str) -> None:
        set_external(tensor, attribute_text(attrs.get("location", b"")),
                     int(attrs.get("offset", 0)), int(attrs.get("length", 0)))

    return _restore(model, is_file_constant, external)


def _restore(model: ModelProto, select: Callable[[NodeProto], bool],
             fill: Callable[[NodeProto, dict[str, object], TensorProto, str], None]) -> int:
    """Each selected FileConstant node back to its origin: an initializer where one was
    turned (at its index), else a Constant node in place; ``fill(node, attrs, tensor,
    where)`` gives the tensor its payload. Our domain's import goes where no node uses it
    any more."""
    count = 0
    for container, where in iter_containers(model):
        restored: list[tuple[int, TensorProto]] = []
        drop: list[int] = []
        for i, node in enumerate(container.node):
            if not select(node):
                continue
            count += 1
            attrs = file_constant_attributes(node)
            node_where = f"{where} node {i} ({OP_TYPE} '{node.name}')"
            tensor = tensor_of(attrs, node, node_where)
            fill(node, attrs, tensor, node_where)
            if attribute_text(attrs.get("origin", b"constant")) == "initializer":
                restored.append((int(attrs.get("initializer_index", 1 << 62)), tensor))
                drop.append(i)
                continue
            to_constant(node, attrs, tensor)
        for i in reversed(drop):
            del container.node[i]
        for index, tensor in sorted(restored, key=lambda x: x[0]):
            container.initializer.insert(min(index, len(container.initializer)), tensor)
    if count:
        drop_unused_domain(model)
    return count


def to_constant(node: NodeProto, attrs: dict[str, object],
                tensor: TensorProto) -> TensorProto:
    """Make a FileConstant node (``attrs``: its attributes) the Constant it stands for,
    in place, its value ``tensor``; returns the value as the node now holds it."""
    node.ClearField("attribute")
    node.op_type = "Constant"
    if "constant_domain" in attrs:
        node.domain = attribute_text(attrs["constant_domain"])
    else:
        node.ClearField("domain")
    node.attribute.append(make_attribute(
        "value", tensor, doc_string=attribute_text(attrs["value_doc_string"])
        if "value_doc_string" in attrs else None))
    return node.attribute[0].t


def tensor_of(attrs: dict[str, object], node: NodeProto, where: str) -> TensorProto:
    """The tensor a FileConstant node stands for, without its payload."""
    for required in ("dtype", "shape"):
        if required not in attrs:
            raise ConversionError(f"FileConstant lacks attribute '{required}'", where=where)
    tensor = TensorProto()
    if "tensor_name" in attrs:
        tensor.name = attribute_text(attrs["tensor_name"])
    elif attribute_text(attrs.get("origin", b"constant")) == "initializer":
        tensor.name = node.output[0]
    tensor.data_type = int(attrs["dtype"])
    if tensor.data_type == TensorProto.UNDEFINED:  # GE's own DT_FLOAT is 0
        raise ConversionError("FileConstant dtype is not an ONNX element type", where=where,
                              dtype=tensor.data_type)
    tensor.dims.extend(int(d) for d in attrs["shape"])
    return tensor


def drop_unused_domain(model: ModelProto) -> None:
    """Remove our domain's opset import from the model and from each function whose nodes
    (subgraphs included) no longer use it: a function of that domain, or a node another
    tool put in it, keeps it."""
    used = {prefix for container, _, prefix in iter_scoped_containers(model)
            if any(node.domain == DOMAIN for node in container.node)}
    if "" not in used:
        drop_domain(model.opset_import)
    for function in model.functions:
        if f"{function_label(function)}/" not in used:
            drop_domain(function.opset_import)


def drop_domain(opsets) -> None:
    for i, o in enumerate(opsets):
        if o.domain == DOMAIN:
            del opsets[i]
            return
