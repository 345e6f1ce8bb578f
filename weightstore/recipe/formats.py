"""Which package format introduced each recipe setting a package records, without yaml
or pydantic: a reader of a summary (the up-to-date check among them) tells from it the
format this version writes a package in."""

from __future__ import annotations

# Layout keys added after package format 1, with the package format that introduced them.
LAYOUT_KEYS_SINCE = {"combined": 2}
