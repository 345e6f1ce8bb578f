"""The package's version, on the ground floor: every module that stamps what it writes
(records, summaries, caches, provenance) imports it from here, never the package's
``__init__`` (the API table, which sits above everything). pyproject.toml carries the same
number (the sdist and wheel tests build under it)."""

__version__ = "0.1.2"
