"""Source digests: cached across builds only while a file provably did not change."""

from __future__ import annotations

import os
import time

from weightstore.io.digests import digest_bytes
from weightstore.package import fingerprint
from weightstore.package.fingerprint import FileDigests


def _age(path, seconds=60):
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_cache_reused_while_unchanged(tmp_path, monkeypatch):
    src = tmp_path / "model.bin"
    src.write_bytes(b"a" * 1000)
    cache = tmp_path / "cache.json"
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", 0)
    first = FileDigests(cache)
    assert first.of(src) == "blake3:" + digest_bytes("blake3", b"a" * 1000)
    first.save()
    assert cache.exists()
    calls = []
    real = fingerprint.digest_file
    monkeypatch.setattr(fingerprint, "digest_file", lambda *a: calls.append(a) or real(*a))
    FileDigests(cache).of(src)
    assert calls == []  # served from the cache
    src.write_bytes(b"b" * 1000)  # same size, new content: ctime and mtime move
    _age(src)  # even with mtime set back, ctime betrays the rewrite
    assert FileDigests(cache).of(src) == "blake3:" + digest_bytes("blake3", b"b" * 1000)
    assert len(calls) == 1


def test_recent_files_are_not_cached(tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(b"x")
    cache = tmp_path / "cache.json"
    digests = FileDigests(cache)
    digests.of(src)
    digests.save()
    assert not cache.exists()  # written just now: too racy to trust a timestamp


def test_corrupt_cache_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr("weightstore.io.identity.RACY_SECONDS", 0)
    src = tmp_path / "model.bin"
    src.write_bytes(b"y" * 10)
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    assert FileDigests(cache).of(src) == "blake3:" + digest_bytes("blake3", b"y" * 10)
