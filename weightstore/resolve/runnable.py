"""A variant with its payloads inline: what ``weightstore scenario replay`` writes.

Deploy-side work over the build side's records: the variant is resolved from metadata
first, by the phases every resolution runs (:func:`.variant.variant_graph`: a scenario's
records replayed, dead weights cleaned up, known ``If`` conditions folded), and only then
are its *live* payloads read: a weight the scenario removed, or only a dead branch reads,
is never read, so a missing file that only such weights use does not matter.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from ..catalogue.payload import describe, read_payload
from ..catalogue.sites import ambiguous_names, iter_tensor_sites, unname_attribute_tensors
from ..convert.encoding import has_payload, set_payload
from ..convert.external_data import ENCODINGS_KEY, pop_metadata
from ..convert.inline import check_digest
from ..io.models import save_model
from ..io.onnx_arrays import from_array
from ..io.onnx_proto import ModelProto, TensorProto
from ..passes.rewriting import derivations_of
from ..scenarios.api import find_scenario
from ..scenarios.derive import resolver
from ..scenarios.operations import output_path
from ..scenarios.variants import catalogue_values
from .source import ModelSource, record_beside, record_key, store_keys_of
from .variant import variant_graph


def runnable_variant(path: str | os.PathLike[str], scenario: str | None) -> ModelProto:
    """The model (or one of its scenarios) with every live payload inline.

    Each live tensor without its value gets it: from its own external data when the model
    stores it (verified against the digest it declares, else a package model's record
    key), computed when a record derives it, else from the base model's weight of that
    name. The file is parsed once.
    """
    path = Path(path)
    entry = record_beside(path)  # a package's model: verified against its record's keys
    keys = None if entry is None else store_keys_of(entry)
    with contextlib.closing(ModelSource.open(path, path.stem)) as source:
        meta = source.metadata()
        resolved = variant_graph(meta, scenario)
        derivations = {}
        if scenario is not None:
            for rewrite in find_scenario(meta, scenario).rewrites:
                derivations.update(derivations_of(rewrite))
        value = resolver(derivations, catalogue_values(source.catalogue, path.parent))
        sites = list(iter_tensor_sites(resolved))
        ambiguous = ambiguous_names(resolved, sites)
        for site in sites:
            t = site.tensor
            if has_payload(t) or t.data_type == TensorProto.STRING:
                continue
            name = site.value_key(ambiguous)
            if t.data_location == TensorProto.EXTERNAL:
                desc = describe(site, source.catalogue, path.parent)
                data = read_payload(desc, source.catalogue)
                key = record_key(keys, desc.location, desc.offset, desc.checksum,
                                 model=str(path), where=site.where)
                check_digest(data, desc.checksum or key, where=site.where, scenario=scenario)
            else:
                data = from_array(np.ascontiguousarray(value(name))).raw_data
            set_payload(t, data)
    # the typed encodings an earlier conversion recorded describe external tensors by
    # structural path: none is external now, and a replay moved the paths
    pop_metadata(resolved, ENCODINGS_KEY)
    return unname_attribute_tensors(resolved)  # the names resolution gave stay inside


def replay_scenario(model: str | os.PathLike[str], name: str,
                    output: str | os.PathLike[str]) -> int:
    """Write scenario ``name``'s model to ``output``, runnable, every payload inline;
    returns its size in bytes."""
    output_path(model, output, replaces_input=False)
    return save_model(runnable_variant(model, name), Path(output))
