"""Credentials as docker, skopeo and oras find them: ``credHelpers`` and ``credsStore`` run
by the credential-helper protocol (real helper processes on PATH), ``auths``, the
environment and ``--username``/``--password-stdin``, in docker's order, against a real
registry with htpasswd auth and against a token service. No secret is ever printed."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from weightstore.cli import main
from weightstore.registry import credential_helpers

from .helpers import scenario_package
from .registry_server import needs_registry, running_registry
from .registry_tokens import TokenService

pytestmark = needs_registry

SECRET = "s3cret-7f3a9c-never-print-me"  # distinctive: searched in every output
WRONG = "wr0ng-b41d2e-never-print-me"

# a helper speaking docker's protocol: what it holds is read from <name>.json beside it,
# each server URL it is asked for is appended to <name>.log
PROTOCOL = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
server = sys.stdin.read()
with open(here / "{name}.log", "a") as log:
    log.write(server + "\\n")
held = json.loads((here / "{name}.json").read_text())
if sys.argv[1:] != ["get"] or server not in held:
    print("credentials not found in native keychain")
    sys.exit(1)
user, secret = held[server]
print(json.dumps({{"ServerURL": server, "Username": user, "Secret": secret}}))
"""

BROKEN = {
    "failing": "#!/bin/sh\necho 'error getting credentials: no session' >&2\nexit 3\n",
    # the helper's own child holds its pipes too: both are killed
    "hanging": "#!/bin/sh\nsleep 60 &\necho $! > \"$(dirname \"$0\")/child.pid\"\nwait\n",
    "garbled": "#!/bin/sh\necho 'Username: x'\n",
}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_package(tmp_path_factory.mktemp("creds"))[0]


@pytest.fixture
def helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder first on PATH for helper programs; DOCKER_CONFIG in tmp_path, no
    credentials in the environment."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    (tmp_path / "docker").mkdir()
    monkeypatch.delenv("WEIGHTSTORE_REGISTRY_USERNAME", raising=False)
    monkeypatch.delenv("WEIGHTSTORE_REGISTRY_PASSWORD", raising=False)
    return folder


def _helper(folder: Path, name: str, held: dict[str, list[str]]) -> None:
    program = folder / f"docker-credential-{name}"
    program.write_text(PROTOCOL.format(python=sys.executable, name=name))
    program.chmod(0o755)
    (folder / f"{name}.json").write_text(json.dumps(held))


def _asked(folder: Path, name: str) -> list[str]:
    log = folder / f"{name}.log"
    return log.read_text().splitlines() if log.exists() else []


def _config(tmp_path: Path, doc: dict) -> None:
    (tmp_path / "docker" / "config.json").write_text(json.dumps(doc))


def _htpasswd(tmp_path: Path) -> Path:
    import bcrypt

    path = tmp_path / "htpasswd"
    path.write_text("ci:" + bcrypt.hashpw(SECRET.encode(), bcrypt.gensalt(rounds=4)).decode()
                    + "\n")
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], caplog) -> tuple[int, str]:
    """Run the CLI; its stderr. No secret in anything it printed or logged."""
    code = main(argv)
    out, err = capsys.readouterr()
    for text in (out, err, caplog.text):
        assert SECRET not in text and WRONG not in text
    return code, err


def test_helpers_and_config_in_dockers_order(package, helpers, tmp_path, capsys,
                                             caplog) -> None:
    with running_registry(tmp_path / "reg", htpasswd=_htpasswd(tmp_path)) as server:
        host = server.host
        ref = f"{host}/creds/a:1"
        _config(tmp_path, {"credHelpers": {host: "perhost"}, "credsStore": "desktop",
                           "auths": {host: {"username": "ci", "password": WRONG}}})
        # credHelpers[host] first: the desktop store and auths are never read
        _helper(helpers, "perhost", {host: ["ci", SECRET]})
        _helper(helpers, "desktop", {host: ["ci", WRONG]})
        assert _run(["push", str(package), ref, "--json"], capsys, caplog)[0] == 0
        assert _asked(helpers, "perhost") == [host]  # the host, as docker writes it
        assert _asked(helpers, "desktop") == []
        # credHelpers' helper holds nothing for the host: credsStore next
        _helper(helpers, "perhost", {})
        _helper(helpers, "desktop", {host: ["ci", SECRET]})
        assert _run(["pull", ref, str(tmp_path / "o1"), "--json"], capsys, caplog)[0] == 0
        assert _asked(helpers, "desktop") == [host]
        # neither helper holds any: auths last
        _helper(helpers, "desktop", {})
        _config(tmp_path, {"credHelpers": {host: "perhost"}, "credsStore": "desktop",
                           "auths": {host: {"username": "ci", "password": SECRET}}})
        assert _run(["pull", ref, str(tmp_path / "o2")], capsys, caplog)[0] == 0
        # the environment comes before every helper
        _helper(helpers, "perhost", {host: ["ci", WRONG]})
        asked = len(_asked(helpers, "perhost"))
        with pytest.MonkeyPatch.context() as env:
            env.setenv("WEIGHTSTORE_REGISTRY_USERNAME", "ci")
            env.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", SECRET)
            assert _run(["pull", ref, str(tmp_path / "o3")], capsys, caplog)[0] == 0
        assert len(_asked(helpers, "perhost")) == asked
        # --username / --password-stdin come before the environment and every helper
        with pytest.MonkeyPatch.context() as env:
            env.setenv("WEIGHTSTORE_REGISTRY_USERNAME", "ci")
            env.setenv("WEIGHTSTORE_REGISTRY_PASSWORD", WRONG)
            env.setattr(sys, "stdin", io.StringIO(SECRET + "\n"))
            assert _run(["pull", ref, str(tmp_path / "o6"), "--username", "ci",
                         "--password-stdin", "--json"], capsys, caplog)[0] == 0
        assert len(_asked(helpers, "perhost")) == asked
        # refused credentials from a helper: one line, the secret not in it
        for flags in ([], ["--json"]):
            code, err = _run(["pull", ref, str(tmp_path / "o4"), *flags], capsys, caplog)
            assert code == 2 and "authentication refused" in err
            assert err.count("\n") == 1
        # an identity token is for a token service; this registry asks for Basic auth
        _helper(helpers, "perhost", {host: ["<token>", SECRET]})
        code, err = _run(["pull", ref, str(tmp_path / "o5")], capsys, caplog)
        assert code == 2 and "identity token" in err and err.count("\n") == 1
    for out in ("o1", "o2", "o3", "o6"):
        assert sorted(p.name for p in (tmp_path / out).iterdir()) == sorted(
            p.name for p in package.iterdir())


def test_helper_identity_token_at_a_token_service(package, helpers, tmp_path, capsys,
                                                  caplog) -> None:
    """A helper's ``<token>`` answer is a refresh token, traded by the OAuth2 POST."""
    with TokenService(tmp_path, "ci", WRONG, refresh_token=SECRET) as tokens, \
            running_registry(tmp_path / "reg", auth=tokens.config()) as server:
        ref = f"{server.host}/creds/t:1"
        _config(tmp_path, {"credsStore": "desktop"})
        _helper(helpers, "desktop", {server.host: ["<token>", SECRET]})
        assert _run(["push", str(package), ref, "--json"], capsys, caplog)[0] == 0
        assert _run(["pull", ref, str(tmp_path / "out"), "--json"], capsys, caplog)[0] == 0
        assert tokens.refreshed >= 2 and tokens.refreshed == tokens.issued
        assert len(list((tmp_path / "out").iterdir())) == len(list(package.iterdir()))
        # user and password from a helper: the token service's GET with Basic auth
        _helper(helpers, "desktop", {server.host: ["ci", WRONG]})
        issued = tokens.issued
        assert _run(["pull", ref, str(tmp_path / "o2")], capsys, caplog)[0] == 0
        assert tokens.issued > issued and tokens.refreshed < tokens.issued
        _helper(helpers, "desktop", {server.host: ["<token>", WRONG]})
        code, err = _run(["pull", ref, str(tmp_path / "o3"), "--json"], capsys, caplog)
        assert code == 2 and "token service" in err and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["missing", *BROKEN])
def test_a_broken_helper_is_one_line_naming_it(kind, helpers, tmp_path, capsys, caplog,
                                               monkeypatch) -> None:
    monkeypatch.setattr(credential_helpers, "HELPER_TIMEOUT", 1.0)
    if kind in BROKEN:
        program = helpers / f"docker-credential-{kind}"
        program.write_text(BROKEN[kind])
        program.chmod(0o755)
    with running_registry(tmp_path / "reg", htpasswd=_htpasswd(tmp_path)) as server:
        # a broken helper is an error, not a fall through to auths
        _config(tmp_path, {"credHelpers": {server.host: kind},
                           "auths": {server.host: {"username": "ci", "password": SECRET}}})
        start = time.monotonic()
        code, err = _run(["pull", f"{server.host}/creds/a:1", str(tmp_path / "out")],
                         capsys, caplog)
        took = time.monotonic() - start
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("weightstore: error: credential helper")
    assert f"docker-credential-{kind}" in err
    assert took < 1.0 + 5.0
    if kind == "hanging":
        assert "did not answer within 1 s" in err
        child = int((helpers / "child.pid").read_text())
        assert _gone(child, 5.0)
    if kind == "failing":
        assert "status=3" in err and "no session" in err
    assert not (tmp_path / "out").exists()


def _gone(pid: int, wait: float) -> bool:
    """The process is dead (gone, or a zombie nobody reaped) within ``wait`` seconds."""
    ends = time.monotonic() + wait
    while time.monotonic() < ends:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_no_secret_in_a_repr() -> None:
    from weightstore.registry.auth import Credentials

    for creds in (Credentials("ci", SECRET), Credentials("", "", identity_token=SECRET)):
        assert SECRET not in repr(creds)



@pytest.mark.parametrize("flags, stdin, why", [
    (["--username", "ci"], SECRET, "go together"),
    (["--password-stdin"], SECRET, "go together"),
    (["--username", "ci", "--password-stdin"], "\n", "no password"),
    (["--username", "c:i", "--password-stdin"], SECRET, "without ':'"),
])
def test_username_and_password_stdin_are_checked(flags, stdin, why, tmp_path, capsys,
                                                 caplog, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code, err = _run(["pull", "127.0.0.1:9/x/y:1", str(tmp_path / "out"), *flags],
                     capsys, caplog)
    assert code == 2 and why in err and err.count("\n") == 1
