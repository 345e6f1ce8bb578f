"""``python -m weightstore``."""

from .cli import run

run()
