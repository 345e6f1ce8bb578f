"""Where an externalized payload ends up: the unit both output forms consume."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalogue.sites import TensorSite


@dataclass(frozen=True)
class Placement:
    """Payload ``key`` ("algo:hex") stored at ``location`` (relative to the model)."""

    location: str
    offset: int
    length: int
    key: str


@dataclass(frozen=True)
class ExternalTensor:
    """One tensor site that moves out of the model, with its original inline encoding."""

    site: TensorSite
    placement: Placement
    encoding: str  # "raw_data" or a typed field name, restored by the reverse conversion
