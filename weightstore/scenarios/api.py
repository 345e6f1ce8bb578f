"""Registering and replaying modification scenarios (the seed's Registration API).

``add_modification_scenario`` validates and normalizes a pass's records and appends them
to the model as a ``ModelModificationScenarioProto``; ``replay_modification_scenario``
reproduces the rewritten graph from that record alone. Neither reads a payload byte, and
every refusal happens before any payload would be selected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._proto import weightstore_pb2 as pb
from ..catalogue.payload import expected_nbytes
from ..catalogue.sites import iter_tensor_sites
from ..convert.encoding import clear_payload, has_payload
from ..errors import ScenarioError
from ..io.onnx_native import check_model, has_schema, validation_error
from ..io.onnx_proto import ModelProto, TensorProto
from ..passes.analysis import STANDARD_DOMAINS, iter_scopes
from ..passes.rewriting import LocalRewriting, apply_record, normalize
from .digest import base_graph_digest
from .storage import FIELD, read_scenarios, unknown_field_set, write_scenarios

REPLAY_FORMAT_VERSION = 1
DIGEST_ALGORITHMS = ("blake3", "sha256")


@dataclass(frozen=True)
class AddModificationScenarioOptions:
    digest_algorithm: str = "blake3"
    replay_format_version: int = REPLAY_FORMAT_VERSION
    replace_existing: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)  # the scenario's own entries


def scenario_names(model: ModelProto) -> list[str]:
    return [s.scenario for s in read_scenarios(model)]


def find_scenario(model: ModelProto, name: str) -> pb.ModelModificationScenarioProto:
    """The scenario called ``name``; unknown or ambiguous names are errors."""
    matches = [s for s in read_scenarios(model) if s.scenario == name]
    if not matches:
        raise ScenarioError("unknown scenario", scenario=name,
                            known=", ".join(scenario_names(model)) or "none")
    if len(matches) > 1:
        raise ScenarioError("scenario name appears more than once", scenario=name)
    return matches[0]


def add_modification_scenario(model: ModelProto, scenario: str,
                              rewrites: Sequence[LocalRewriting],
                              options: AddModificationScenarioOptions | None = None,
                              ) -> pb.ModelModificationScenarioProto:
    """Append ``scenario`` (made of ``rewrites``) to ``model`` in place; returns the record.

    Writes no weight file: weights are partitioned once, when a package is written.
    """
    options = options or AddModificationScenarioOptions()
    if not scenario:
        raise ScenarioError("scenario name is empty")
    if options.digest_algorithm not in DIGEST_ALGORITHMS:
        raise ScenarioError("unsupported digest algorithm", scenario=scenario,
                            algorithm=options.digest_algorithm)
    if options.replay_format_version != REPLAY_FORMAT_VERSION:
        raise ScenarioError("unsupported replay format version", scenario=scenario,
                            version=options.replay_format_version)
    existing = read_scenarios(model)
    if any(s.scenario == scenario for s in existing) and not options.replace_existing:
        raise ScenarioError("scenario already exists (replace it with --replace; in Python, "
                            "add_scenario(..., replace=True))", scenario=scenario)
    base = strip_scenarios(model)
    records, _ = prepare_records(base, scenario, rewrites)
    proto = pb.ModelModificationScenarioProto(
        scenario=scenario,
        base_graph_digest=base_graph_digest(base, algo=options.digest_algorithm),
        digest_algorithm=options.digest_algorithm,
        replay_format_version=options.replay_format_version)
    proto.rewrites.extend(records)
    for key, value in sorted(options.metadata.items()):
        proto.metadata_props.add(key=key, value=value)
    kept = [s for s in existing if s.scenario != scenario]
    if len(kept) == len(existing):
        write_scenarios(model, [*existing, proto])
    else:  # replaced in place, keeping the others' order
        write_scenarios(model, [proto if s.scenario == scenario else s for s in existing])
    return proto


def prepare_records(base: ModelProto, scenario: str,
                    rewrites: Sequence[LocalRewriting],
                    ) -> tuple[list[pb.LocalRewritingProto], ModelProto]:
    """Normalize ``rewrites`` on ``base`` and check the result: (records, rewritten model)."""
    try:
        records, result = normalize(base, rewrites)
        structural_check(result)
    except ScenarioError as exc:
        exc.context.setdefault("scenario", scenario)
        raise
    return records, result


def remove_modification_scenario(model: ModelProto, scenario: str) -> None:
    find_scenario(model, scenario)
    write_scenarios(model, [s for s in read_scenarios(model) if s.scenario != scenario])


def strip_scenarios(model: ModelProto) -> ModelProto:
    """A copy of ``model`` without its scenarios (every other field kept)."""
    out = ModelProto()
    if all(f.field_number == FIELD for f in unknown_field_set(model)):
        for descriptor, value in model.ListFields():  # known fields only: no re-parse
            target = getattr(out, descriptor.name)
            if (descriptor.is_repeated if hasattr(descriptor, "is_repeated")  # protobuf 5
                    else descriptor.label == descriptor.LABEL_REPEATED):
                target.extend(value)
            elif descriptor.message_type is not None:
                target.CopyFrom(value)
            else:
                setattr(out, descriptor.name, value)
        return out
    out.CopyFrom(model)
    write_scenarios(out, [])
    return out


def check_scenarios(model: ModelProto) -> list[pb.ModelModificationScenarioProto]:
    """All scenarios, after the checks that need no replay: names and versions."""
    scenarios = read_scenarios(model)
    seen: set[str] = set()
    for s in scenarios:
        if not s.scenario:
            raise ScenarioError("a scenario has an empty name")
        if s.scenario in seen:
            raise ScenarioError("scenario name appears more than once", scenario=s.scenario)
        seen.add(s.scenario)
        if s.replay_format_version != REPLAY_FORMAT_VERSION:
            raise ScenarioError("unsupported replay format version", scenario=s.scenario,
                                version=s.replay_format_version)
    return scenarios


def replay_modification_scenario(model: ModelProto,
                                 scenario: str | pb.ModelModificationScenarioProto,
                                 ) -> ModelProto:
    """The model as ``scenario`` rewrites it, without scenarios, from metadata alone.

    Returns a whole ModelProto (its ``graph`` is the seed's replayed GraphProto) because
    records may also rewrite model-local functions. Added initializers whose bytes derive
    from other weights carry no payload here; their recipes are in the records' metadata.
    """
    check_scenarios(model)
    record = find_scenario(model, scenario) if isinstance(scenario, str) else scenario
    base = strip_scenarios(model)  # one copy: verified, then rewritten in place
    verify_base(base, record, stripped=True)
    return _apply_records(base, record)


def verify_base(model: ModelProto, record: pb.ModelModificationScenarioProto, *,
                stripped: bool = False) -> None:
    """Refuse a record whose version, algorithm or base graph digest does not fit ``model``
    (``stripped``: ``model`` is already a copy without scenarios)."""
    name = record.scenario
    if record.replay_format_version != REPLAY_FORMAT_VERSION:
        raise ScenarioError("unsupported replay format version", scenario=name,
                            version=record.replay_format_version)
    if record.digest_algorithm not in DIGEST_ALGORITHMS:
        raise ScenarioError("unsupported digest algorithm", scenario=name,
                            algorithm=record.digest_algorithm)
    base = model if stripped else strip_scenarios(model)
    if base_graph_digest(base, algo=record.digest_algorithm) != record.base_graph_digest:
        raise ScenarioError("base graph digest mismatch: the scenario was made for another "
                            "graph", scenario=name)


def apply_scenario(model: ModelProto, record: pb.ModelModificationScenarioProto,
                   ) -> ModelProto:
    """Apply a verified scenario's records to a copy of ``model`` (without scenarios).

    Callers verify the record first (:func:`verify_base`), possibly on another form of the
    same graph: the catalogued model, before its payloads were inlined.
    """
    return _apply_records(strip_scenarios(model), record)


def _apply_records(base: ModelProto, record: pb.ModelModificationScenarioProto,
                   ) -> ModelProto:
    for index, rewrite in enumerate(record.rewrites):
        try:
            apply_record(base, rewrite)
        except ScenarioError as exc:
            exc.context.setdefault("scenario", record.scenario)
            exc.context.setdefault("record", index)
            exc.context.setdefault("operation", rewrite.operation_name)
            raise
    return base


def rebase_scenarios(source: ModelProto, target: ModelProto) -> int:
    """Carry ``source``'s scenarios over to ``target``, the same graph in another form.

    Each scenario is verified against ``source`` first; its digest is then taken on
    ``target`` (whose tensors may carry checksums where ``source`` had inline payloads).
    Returns how many scenarios were carried.
    """
    records = check_scenarios(source)
    rebased = []
    for record in records:
        verify_base(source, record)
        copy = pb.ModelModificationScenarioProto()
        copy.CopyFrom(record)
        copy.base_graph_digest = base_graph_digest(strip_scenarios(target),
                                                   algo=record.digest_algorithm)
        rebased.append(copy)
    write_scenarios(target, rebased)
    return len(rebased)


def structural_check(model: ModelProto) -> None:
    """onnx's checker on a rewritten metadata model.

    The checker wants every tensor to hold its values, which a metadata model does not:
    for the check only, each omitted payload is stood in for by a one-element tensor of
    the same type. Without ``full_check`` the checker does not infer shapes, so this judges
    the graph's structure (topology, operators, attributes, scoping), not its weights.
    A node of the standard domain whose operator onnx does not define (onnxruntime's
    ``SimplifiedLayerNormalization``, which onnxruntime-genai's builder writes there) is
    judged like a node of any other domain: by its place in the graph only.
    """
    probe = ModelProto()
    probe.CopyFrom(model)
    write_scenarios(probe, [])
    _unknown_standard_ops_apart(probe)
    for site in iter_tensor_sites(probe):
        t = site.tensor
        if has_payload(t) or t.data_type in (TensorProto.STRING,
                                             TensorProto.UNDEFINED):
            continue
        clear_payload(t)
        del t.dims[:]
        t.dims.append(1)
        t.raw_data = bytes(expected_nbytes(t.data_type, [1]) or 1)
    try:
        check_model(probe)
    except validation_error() as exc:
        first = str(exc).strip().splitlines()[0]
        raise ScenarioError(f"rewritten graph fails onnx's checker: {first}") from None


UNCHECKED_DOMAIN = "weightstore.unchecked"


def _unknown_standard_ops_apart(model: ModelProto) -> None:
    """Move the standard-domain nodes whose operator onnx does not define to a domain of
    their own, which the checker does not judge by schema."""
    moved = False
    for scope in iter_scopes(model):
        for node in scope.container.node:
            if node.domain in STANDARD_DOMAINS and not has_schema(node.op_type):
                node.domain = UNCHECKED_DOMAIN
                moved = True
    if moved:
        model.opset_import.add(domain=UNCHECKED_DOMAIN, version=1)
        for function in model.functions:
            function.opset_import.add(domain=UNCHECKED_DOMAIN, version=1)
