"""Release artifacts: file inventories, deterministic archives, checksums, provenance,
safe unpacking and package diffs.

Each module pairs a pure planner (metadata in, a frozen plan out) with a thin executor;
:mod:`.api` runs them for ``weightstore release``, ``verify``, ``unpack`` and ``diff``.
"""

from __future__ import annotations
