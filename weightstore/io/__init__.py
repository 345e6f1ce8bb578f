"""The file-system primitives every other part builds on.

:mod:`.files`: temp file + fsync + atomic rename, range copies, bounded JSON;
:mod:`.locks`: flock-based locks (filelock) taken before reading what they protect;
:mod:`.digests`: blake3 / sha256 hashing of files and ranges;
:mod:`.models`: writing ONNX models, size limits checked first;
:mod:`.onnx_proto`: onnx's message classes, without the cost of onnx's initialiser.

Nothing here imports the rest of weightstore beyond :mod:`weightstore.errors`.
"""
