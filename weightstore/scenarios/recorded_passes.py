"""The passes a scenario was made by, stored with its records, and the scenario's digest.

Records replay without their passes; the passes, each in its canonical form (the bare
name of a pass without parameters, else its name and every parameter, defaults filled:
:func:`weightstore.recipe.pass_params.canonical`), are kept beside them as the scenario's
``weightstore.passes`` metadata entry (sorted, compact JSON), so that a stored scenario
says how it was made and two scenarios made with other parameters never look alike.

The *scenario digest* names what a scenario does, wherever it is stored: its name, its
records and its passes, not the base graph it is bound to (``base_graph_digest`` does
that) nor the device requirements. Changing one pass parameter changes it, even when the
records come out the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._proto import weightstore_pb2 as pb
from ..errors import ScenarioError
from ..io.digests import digest_bytes, make_key
from ..io.files import parse_json

if TYPE_CHECKING:  # pydantic only for the commands that run passes, not `scenario list`
    from ..recipe.pass_params import PassStep

PASSES_KEY = "weightstore.passes"
DIGEST_ALGORITHM = "blake3"


def steps_of(passes: Sequence[str | Mapping[str, Any] | PassStep]) -> list[PassStep]:
    """Each pass (a bare name, a ``{name, <parameters>}`` mapping or a step) validated,
    as ``(name, canonical parameters)``."""
    from ..recipe.pass_params import parse_step

    out = []
    for item in passes:
        if isinstance(item, tuple):
            out.append(parse_step({**item[1], "name": item[0]}))
        else:
            out.append(parse_step(item))
    return out


def passes_entry(steps: Sequence[PassStep]) -> tuple[str, str]:
    """The metadata entry recording ``steps``."""
    from ..recipe.pass_params import canonical, canonical_text

    return PASSES_KEY, canonical_text([canonical(name, params) for name, params in steps])


def passes_text(scenario: pb.ModelModificationScenarioProto) -> str | None:
    """The text of a stored scenario's passes entry (checked to be a JSON list); None
    when it records none (made before passes were recorded, or by another tool)."""
    for entry in scenario.metadata_props:
        if entry.key == PASSES_KEY:
            try:
                value = parse_json(entry.value)
            except ValueError:
                value = None
            if not isinstance(value, list):
                raise ScenarioError("malformed scenario passes", scenario=scenario.scenario)
            return entry.value
    return None


def passes_of(scenario: pb.ModelModificationScenarioProto) -> list[Any] | None:
    """The canonical passes a stored scenario records (see :func:`passes_text`)."""
    text = passes_text(scenario)
    return None if text is None else parse_json(text)


def scenario_digest(name: str, records: Sequence[pb.LocalRewritingProto],
                    passes: str | None) -> str:
    """``blake3:<hex>`` of the scenario ``name`` made of ``records`` by ``passes`` (the
    text of its passes entry, None when it records none)."""
    whole = pb.ModelModificationScenarioProto(scenario=name)
    whole.rewrites.extend(records)
    if passes is not None:
        whole.metadata_props.add(key=PASSES_KEY, value=passes)
    data = whole.SerializeToString(deterministic=True)
    return make_key(DIGEST_ALGORITHM, digest_bytes(DIGEST_ALGORITHM, data))


def stored_digest(scenario: pb.ModelModificationScenarioProto) -> str:
    """The digest of a stored scenario (see :func:`scenario_digest`)."""
    return scenario_digest(scenario.scenario, scenario.rewrites, passes_text(scenario))
