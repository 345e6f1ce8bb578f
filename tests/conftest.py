"""Shared fixtures: an isolated store location per test and cheap sample models."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from .samples import make_encoder, make_shared_pair

SaveModel = Callable[..., Path]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``WEIGHTSTORE_DIR``, the XDG cache and ``WEIGHTSTORE_CERTS_D`` at a fresh
    temporary folder."""
    root = tmp_path_factory.mktemp("env")
    monkeypatch.setenv("WEIGHTSTORE_DIR", str(root / "store"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    # registries' TLS folders (CAs, client certificates): none but a test's own
    monkeypatch.setenv("WEIGHTSTORE_CERTS_D", str(root / "certs.d"))
    return root


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


@pytest.fixture(scope="session")
def _encoder_master() -> onnx.ModelProto:
    return make_encoder()


@pytest.fixture(scope="session")
def _shared_pair_master() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    return make_shared_pair()


@pytest.fixture
def encoder_model(_encoder_master: onnx.ModelProto) -> onnx.ModelProto:
    """A small encoder from ``make_encoder()`` (a fresh copy, safe to mutate)."""
    return _copy(_encoder_master)


@pytest.fixture
def shared_pair(
    _shared_pair_master: tuple[onnx.ModelProto, onnx.ModelProto],
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Two encoders sharing embeddings and the first layer (fresh copies)."""
    first, second = _shared_pair_master
    return _copy(first), _copy(second)


@pytest.fixture
def save_model(tmp_path: Path) -> SaveModel:
    """A function ``save(model, path="model.onnx", **kwargs) -> Path``.

    Relative paths land in ``tmp_path``; keyword arguments go to ``onnx.save_model`` (for
    example ``save_as_external_data=True``).
    """

    def save(model: onnx.ModelProto, path: str | Path = "model.onnx", **kwargs: Any) -> Path:
        target = Path(path)
        if not target.is_absolute():
            target = tmp_path / target
        target.parent.mkdir(parents=True, exist_ok=True)
        if kwargs.get("save_as_external_data"):
            model = _copy(model)  # conversion to external data rewrites the model in place
        onnx.save_model(model, str(target), **kwargs)
        return target

    return save


@pytest.fixture(scope="session")
def split_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built recipe (store and packages) of the sample encoder with three scenarios and
    five devices (see ``tests.test_split.RECIPE``); read-only: copy before changing it."""
    from weightstore.builder.run import BuildOptions, build

    from .test_split import _write

    folder = tmp_path_factory.mktemp("split-build")
    build(_write(folder, make_encoder()), BuildOptions(jobs=2))
    return folder


@pytest.fixture(scope="session")
def chromium() -> Any:
    """Headless Chromium (tests.browser), or a skip where Debian's chromium is absent."""
    from .browser import Chromium, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium: .ci/run)")
    return Chromium(binary)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, where this user may mount one (root); unmounted afterwards."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every host a request connects to, in order; a connection to a host that is not
    loopback is refused here, before any packet leaves, so a test never sends traffic
    elsewhere whatever the code under test does (and says that it tried)."""
    import socket

    from weightstore.io.net import loopback_name

    real = socket.create_connection
    hosts: list[str] = []

    def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        hosts.append(address[0])
        if not loopback_name(address[0]):
            raise ConnectionRefusedError(f"test: no connection to {address[0]}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return hosts
