"""A built package folder: writing it, its summary and fingerprint, checking it, and the
device bundles assembled from it.

Nothing is imported here: each module loads on first use (see :mod:`weightstore.lazy`).
"""
