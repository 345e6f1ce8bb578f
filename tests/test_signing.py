"""Ed25519 keys, DSSE envelopes and signed release provenance (``release --sign`` and
``--verify``), the envelopes checked by an independent implementation: securesystemslib's
DSSE verifier, as in-toto uses it."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat

import pytest

from tests.release_helpers import make_checkout
from weightstore.cli import main
from weightstore.errors import SignatureError
from weightstore.release.api import ReleaseOptions, release
from weightstore.release.attestation import ATTESTATION_NAME, verify_release
from weightstore.signing import dsse
from weightstore.signing.keys import (
    TRUSTED_KEYS_ENV,
    generate,
    load_private,
    parse_public,
    trusted_keys,
)

securesystemslib = pytest.importorskip("securesystemslib", reason="the independent DSSE "
                                       "verifier (pip install securesystemslib)")


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "keys" / "release.pem"
    path.parent.mkdir()
    return path, generate(path)


@pytest.fixture
def signed(encoder_model, tmp_path, key):
    recipe = make_checkout(tmp_path / "checkout", encoder_model)
    result = release(recipe, ReleaseOptions(jobs=2, signer=load_private(key[0])))
    return result, key[1]


def _sslib_key(public):
    from securesystemslib.signer import SSlibKey

    return SSlibKey(public.keyid, "ed25519", "ed25519", {"public": public.raw.hex()})


def test_a_generated_key_is_private_and_refuses_to_be_overwritten(key, capsys):
    path, public = key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_private(path).public == public
    assert main(["key", "generate", str(path)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["key", "public", str(path)]) == 0
    assert capsys.readouterr().out.strip() == public.text
    os.chmod(path, 0o640)
    with pytest.raises(SignatureError, match="open to other users"):
        load_private(path)


def test_keys_from_the_environment_and_the_trusted_keys_file(key, tmp_path, monkeypatch):
    path, public = key
    os.chmod(path, 0o600)
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", path.read_text())
    assert load_private().public == public
    other = generate(tmp_path / "keys" / "old.pem")
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    (config / "weightstore").mkdir(parents=True)
    (config / "weightstore" / "trusted-keys").write_text(
        f"# rotation: the old key stays trusted until every entry it signed is gone\n"
        f"{other.text}\n")
    monkeypatch.setenv(TRUSTED_KEYS_ENV, public.text)
    assert trusted_keys() == [other, public]
    monkeypatch.setenv(TRUSTED_KEYS_ENV, "ed25519:nothex")
    with pytest.raises(SignatureError, match="not a public key"):
        trusted_keys()
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", "-----BEGIN PRIVATE KEY-----\nAAAA\n")
    with pytest.raises(SignatureError, match="not a PEM private key"):
        load_private()


def test_an_envelope_verifies_in_securesystemslib(key):
    from securesystemslib.dsse import Envelope

    private = load_private(key[0])
    doc = dsse.envelope(b'{"_type": "https://in-toto.io/Statement/v1"}', private)
    assert doc == dsse.envelope(b'{"_type": "https://in-toto.io/Statement/v1"}', private)
    theirs = Envelope.from_dict(json.loads(json.dumps(doc)))  # it takes the dict apart
    assert set(theirs.verify([_sslib_key(private.public)], 1)) == {private.public.keyid}
    payload, signer = dsse.open_envelope(doc, [private.public])
    assert payload == theirs.payload and signer == private.public
    assert theirs.pae() == dsse.pae(doc["payloadType"], payload)


def test_a_signed_release_verifies_here_and_in_securesystemslib(signed, capsys):
    from securesystemslib.dsse import Envelope

    result, public = signed
    out = result.output
    lines = (out / ATTESTATION_NAME).read_bytes().splitlines()
    assert len(lines) == 1 and result.signed_by == public.text
    envelope = Envelope.from_dict(json.loads(lines[0]))
    envelope.verify([_sslib_key(public)], 1)
    assert envelope.payload == (out / "release.json").read_bytes()
    assert envelope.payload_type == "application/vnd.in-toto+json"
    check = verify_release(out, [public])
    assert check.ok and set(check.subjects) == {a.file_name for a in result.archives}
    assert main(["release", "--verify", str(out), "--key", public.text]) == 0
    assert f"verified: {len(result.archives)} file(s)" in capsys.readouterr().out


def test_tampering_with_a_signed_release_fails_its_verification(signed, tmp_path, capsys):
    result, public = signed
    stranger = generate(tmp_path / "stranger.pem")
    assert main(["release", "--verify", str(result.output), "--key", stranger.text]) == 1
    assert "signed by no trusted key" in capsys.readouterr().err

    archive = result.output / result.archives[0].file_name
    copy = tmp_path / "copy"
    shutil.copytree(result.output, copy)
    with open(copy / archive.name, "r+b") as f:  # one byte of an archive
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    check = verify_release(copy, [public])
    assert not check.ok and "SHA-256 is not the one the provenance signs" in check.problems[0]
    assert main(["release", "--verify", str(copy), "--key", public.text]) == 1

    shutil.rmtree(copy)
    shutil.copytree(result.output, copy)
    provenance = json.loads((copy / "release.json").read_text())
    provenance["subject"][0]["digest"]["sha256"] = "0" * 64  # the provenance itself
    (copy / "release.json").write_text(json.dumps(provenance))
    with pytest.raises(SignatureError, match=r"not release\.json"):
        verify_release(copy, [public])

    shutil.rmtree(copy)
    shutil.copytree(result.output, copy)
    doc = json.loads((copy / ATTESTATION_NAME).read_text())
    doc["signatures"][0]["sig"] = base64.b64encode(b"\0" * 64).decode()
    (copy / ATTESTATION_NAME).write_text(json.dumps(doc) + "\n")
    with pytest.raises(SignatureError, match="does not verify"):
        verify_release(copy, [public])

    (copy / ATTESTATION_NAME).unlink()
    assert main(["release", "--verify", str(copy), "--key", public.text]) == 1
    assert "not signed" in capsys.readouterr().err


def test_signing_is_reproducible_and_an_unsigned_release_drops_an_old_signature(
        signed, key):
    result, _ = signed
    recipe = result.output.parent.parent.parent / "recipe.yaml"
    first = (result.output / ATTESTATION_NAME).read_bytes()
    again = release(recipe, ReleaseOptions(jobs=1, signer=load_private(key[0])))
    assert (again.output / ATTESTATION_NAME).read_bytes() == first
    release(recipe, ReleaseOptions(jobs=2))
    assert not (result.output / ATTESTATION_NAME).exists()


def test_release_sign_and_verify_on_the_command_line(encoder_model, tmp_path, key,
                                                    monkeypatch, capsys):
    path, public = key
    recipe = make_checkout(tmp_path / "checkout", encoder_model)
    os.chmod(path, 0o644)
    assert main(["release", str(recipe), "--sign", str(path)]) == 2  # before any build
    assert "open to other users" in capsys.readouterr().err
    assert not (recipe.parent / "out").exists()
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", path.read_text())
    assert main(["release", str(recipe), "--sign"]) == 0
    out = recipe.parent / "out" / "releases" / "pkg-1.0.0"
    assert f"with {public.text}" in capsys.readouterr().out
    monkeypatch.setenv(TRUSTED_KEYS_ENV, public.text)  # the trusted keys by default
    assert main(["release", "--verify", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["release", str(recipe), "--check"]) == 0  # the attestation is allowed
    monkeypatch.delenv(TRUSTED_KEYS_ENV)
    assert main(["release", "--verify", str(out)]) == 2
    assert "no key to verify with" in capsys.readouterr().err
    pub = tmp_path / "release.pub"
    pub.write_text(f"# the release key\n{public.text}\n")
    assert parse_public(str(pub)) == public
    assert main(["release", "--verify", str(out), "--key", str(pub)]) == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root (CI runs as root)")
def test_a_trusted_keys_file_others_can_change_is_refused(key, tmp_path, monkeypatch,
                                                          capsys):
    """As OpenSSH refuses such an ``authorized_keys``: writable by others, owned by
    another user, or in a folder others can write; one line naming the file."""
    _, public = key
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv(TRUSTED_KEYS_ENV, raising=False)
    folder = config / "weightstore"
    folder.mkdir(parents=True)
    path = folder / "trusted-keys"
    path.write_text(f"{public.text}\n")
    os.chmod(path, 0o644)
    assert trusted_keys() == [public]
    os.chmod(path, 0o666)
    with pytest.raises(SignatureError) as err:
        trusted_keys()
    assert str(err.value) == ("the trusted-keys file is open to other users: chmod go-w it "
                              f"(file={path}, mode=0o666)")
    os.chmod(path, 0o644)
    os.chown(path, os.geteuid() + 4242, -1)
    with pytest.raises(SignatureError) as err:
        trusted_keys()
    assert str(err.value) == ("the trusted-keys file belongs to another user "
                              f"(file={path}, owner={os.geteuid() + 4242})")
    os.chown(path, os.geteuid(), -1)
    os.chmod(folder, 0o777)
    with pytest.raises(SignatureError) as err:
        trusted_keys()
    assert str(err.value) == ("the trusted-keys file is in a folder other users can write: "
                              f"chmod go-w it (file={path}, folder={folder}, mode=0o777)")
    os.chmod(folder, 0o1777)  # sticky, as /tmp: no one else can replace the file
    assert trusted_keys() == [public]
    os.chmod(folder, 0o755)
    os.chown(config, os.geteuid() + 4242, -1)
    with pytest.raises(SignatureError, match="is in a folder of another user"):
        trusted_keys()
    os.chown(config, os.geteuid(), -1)
    os.chmod(path, 0o666)
    assert main(["release", "--verify", str(tmp_path)]) == 2  # the command's one line
    assert capsys.readouterr().err == ("weightstore: error: the trusted-keys file is open to "
                                       f"other users: chmod go-w it (file={path}, "
                                       "mode=0o666)\n")


def test_key_generate_makes_missing_folders_private_and_refuses_a_folder(tmp_path, capsys):
    """The README's ``key generate ~/.config/weightstore/release.pem`` on a fresh home;
    ``DIR/`` names a folder, never a key file named DIR."""
    path = tmp_path / "home" / ".config" / "weightstore" / "release.pem"
    assert main(["key", "generate", str(path)]) == 0
    assert load_private(path).public.text == capsys.readouterr().out.strip()
    for folder in (path.parent, path.parent.parent, path.parent.parent.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for given in (f"{tmp_path / 'keys'}/", str(path.parent)):
        assert main(["key", "generate", given]) == 2
        assert capsys.readouterr().err == ("weightstore: error: a key file path is needed, "
                                           f"not a folder (file={given})\n")
    assert not (tmp_path / "keys").exists()


def _sums_variants(sums: bytes, other: bytes) -> dict[str, bytes]:
    """SHA256SUMS as release wrote it, edited; ``other`` is another file's digest."""
    lines = sums.splitlines(keepends=True)
    first_hex, _, first_name = lines[0].partition(b"  ")
    zero = b"0" * 64 + b"  " + first_name
    return {
        "as written": sums,
        "a zero line before the right one": zero + sums,
        "a zero line after the right one": sums + zero,
        "the right line twice": lines[0] + sums,
        "another file's digest": other + b"  " + first_name + b"".join(lines[1:]),
        "a line for a file not there": sums + b"0" * 64 + b"  absent.tar.zst\n",
        "a line dropped": b"".join(lines[1:]),
        "a malformed line": sums + b"garbage\n",
        "binary mode marker": first_hex + b" *" + first_name + b"".join(lines[1:]),
        "a path outside": sums + first_hex + b"  ../" + first_name,
    }


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="GNU coreutils' sha256sum")
def test_what_sha256sum_fails_release_verify_fails(signed, tmp_path, capsys):
    """Edited SHA256SUMS files, each checked by GNU sha256sum -c and by release --verify:
    whatever sha256sum fails, --verify fails too (and it fails any list other than the one
    release writes of the signed subjects)."""
    import subprocess

    result, public = signed
    sums = (result.output / "SHA256SUMS").read_bytes()
    other = result.archives[1].sha256.encode()
    sha256sum_failed = set()
    for name, text in _sums_variants(sums, other).items():
        copy = tmp_path / name.replace(" ", "-")
        shutil.copytree(result.output, copy)
        (copy / "SHA256SUMS").write_bytes(text)
        gnu = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=copy,
                             capture_output=True)
        code = main(["release", "--verify", str(copy), "--key", public.text])
        capsys.readouterr()
        if gnu.returncode != 0:
            sha256sum_failed.add(name)
            assert code == 1, name
        assert (code == 0) == (name == "as written"), name
    assert {"a zero line before the right one", "another file's digest",
            "a line for a file not there"} <= sha256sum_failed


@pytest.mark.parametrize("kind", ["folder", "link to /etc", "link to a file",
                                  "archive as a link", "fifo"])
def test_release_verify_names_what_is_no_release_file(signed, tmp_path, capsys, kind):
    """A release folder holds the signed files and nothing else: an extra folder, a link
    (to /etc, or to a file), an archive replaced by a link to its very bytes, or a FIFO
    (never opened) fails --verify, naming it."""
    result, public = signed
    copy = tmp_path / "copy"
    shutil.copytree(result.output, copy)
    archive = result.archives[0].file_name
    name = {"folder": "extra", "link to /etc": "etc", "link to a file": "notes.txt",
            "archive as a link": archive, "fifo": "pipe"}[kind]
    if kind == "folder":
        (copy / name).mkdir()
        (copy / name / "x.tar.zst").write_bytes(b"x")
    elif kind == "link to /etc":
        (copy / name).symlink_to("/etc")
    elif kind == "link to a file":
        (copy / name).symlink_to(copy / "SHA256SUMS")
    elif kind == "archive as a link":
        (copy / name).rename(tmp_path / name)
        (copy / name).symlink_to(tmp_path / name)
    else:
        os.mkfifo(copy / name)
    check = verify_release(copy, [public])
    assert not check.ok and any(p.startswith(f"{name}: ") for p in check.problems), \
        check.problems
    assert main(["release", "--verify", str(copy), "--key", public.text]) == 1


def test_a_base64_key_in_the_environment_a_ci_secret_store_can_mask(key, monkeypatch, capsys):
    """GitLab masks only values of one line from the base64 alphabet: the PEM, base64
    encoded on one line, in $WEIGHTSTORE_SIGNING_KEY_B64, signs as the PEM does."""
    path, public = key
    os.chmod(path, 0o600)
    encoded = base64.b64encode(path.read_bytes()).decode()
    assert re.fullmatch(r"[A-Za-z0-9+/=]{8,}", encoded)  # maskable
    monkeypatch.delenv("WEIGHTSTORE_SIGNING_KEY", raising=False)
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY_B64", encoded)
    assert load_private().public == public
    assert main(["key", "public"]) == 0
    assert capsys.readouterr().out.strip() == public.text
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY_B64", encoded[:-5] + "!!!!=")
    with pytest.raises(SignatureError, match="not base64") as info:
        load_private()
    assert info.value.context["variable"] == "WEIGHTSTORE_SIGNING_KEY_B64"
    # both set: which one signs would be a guess
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY_B64", encoded)
    monkeypatch.setenv("WEIGHTSTORE_SIGNING_KEY", path.read_text())
    with pytest.raises(SignatureError, match="set only one"):
        load_private()
