"""Layout: pure planning of weight files and offsets, and the writer that executes a plan."""
