"""OCI distribution: push packages to registries and pull them back (CNCF ModelPack shape).

Pure parts (:mod:`.reference`, :mod:`.artifact`, :mod:`.responses`) plan and parse; the
executors (:mod:`.push`, :mod:`.pull`) carry out plans through :mod:`.client`.
"""

from __future__ import annotations
