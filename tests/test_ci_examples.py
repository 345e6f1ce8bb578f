"""examples/ci: each CI file's steps run as its runner runs them (a fresh home, the
variables the file sets and the secrets it names, against a real registry), its install
line builds and installs, and the script runs as two CI runners would, each with an empty
store."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.registry_server import needs_registry, running_registry
from tests.release_helpers import make_checkout
from weightstore.signing.keys import generate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "ci"
SCRIPT = "examples/ci/ci.sh"
INSTALL = re.compile(r'pip install "(?P<requirement>[^"]+)"')
# GitLab masks a value only if it is one line of at least 8 characters of these
MASKABLE = re.compile(r"[A-Za-z0-9+/=@:.~]{8,}")
OWNER_REPO = "Weight-Store/Tiny-Models"  # capitals, as GitHub owners and names may have


def _github() -> dict:
    return yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())["jobs"]["package"]


def _gitlab() -> dict:
    return yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())["package"]


def test_the_ci_files_parse_and_call_the_script():
    github, gitlab = _github(), _gitlab()
    assert any(SCRIPT in s.get("run", "") for s in github["steps"])
    assert any(SCRIPT in line for line in gitlab["script"])
    env, variables = github["env"], gitlab["variables"]
    for name in ("WEIGHTSTORE_CACHE", "PUSH_REPOSITORY"):  # what the script needs
        assert name in env and name in variables
    # GitHub names its secrets in the file; GitLab's are the project's CI/CD variables
    assert "secrets.WEIGHTSTORE_SIGNING_KEY_B64" in env["WEIGHTSTORE_SIGNING_KEY_B64"]
    assert "WEIGHTSTORE_TRUSTED_KEYS" in env
    assert os.access(EXAMPLES / "ci.sh", os.X_OK)


def _install_lines() -> list[str]:
    lines = [s["run"] for s in _github()["steps"] if "pip install" in s.get("run", "")]
    lines += [line for line in _gitlab()["script"] if "pip install" in line]
    return lines


def _github_value(text: str, context: dict[str, str]) -> str:
    """``${{ x.y }}`` expressions as the runner fills them in; one the test does not
    model fails the test."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        assert name in context, f"an expression the test does not model: {name}"
        return context[name]

    return re.sub(r"\$\{\{(.*?)\}\}", fill, text)


def _gitlab_value(text: str, defined: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` as GitLab expands them in job variables."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in defined, f"a variable the test does not model: {name}"
        return defined[name]

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", fill, text)


def _runner_env(tmp: Path) -> dict[str, str]:
    """A runner's environment: a fresh home, nothing of this machine's weightstore
    settings, ``weightstore`` on the PATH as the install step puts it there (this tree,
    run by this interpreter)."""
    home, bin_ = tmp / "home", tmp / "bin"
    home.mkdir()
    bin_.mkdir()
    shim = bin_ / "weightstore"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m weightstore '
                    '"$@"\n')
    shim.chmod(0o755)
    return {"HOME": str(home), "PATH": f"{bin_}:{os.environ['PATH']}", "LANG": "C.UTF-8",
            "CI": "true"}


def _checkout(tmp: Path, model) -> Path:
    """A model repository as the examples expect it: recipes/model.yaml and the script."""
    recipe = make_checkout(tmp / "checkout" / "recipes", model)
    recipe.rename(recipe.parent / "model.yaml")
    script = tmp / "checkout" / SCRIPT
    script.parent.mkdir(parents=True)
    shutil.copy2(EXAMPLES / "ci.sh", script)
    return tmp / "checkout"


def _secrets(tmp: Path) -> tuple[str, str]:
    """The signing key as the files ask for it (base64 of the PEM on one line) and the
    public key to trust."""
    public = generate(tmp / "keys" / "ci.pem")
    encoded = base64.b64encode((tmp / "keys" / "ci.pem").read_bytes()).decode()
    assert MASKABLE.fullmatch(encoded)  # GitLab accepts it as a masked variable
    return encoded, public.text


def _run(commands: list[tuple[list[str], str]], cwd: Path, env: dict[str, str]) -> str:
    out = []
    for argv, script in commands:
        proc = subprocess.run([*argv, script] if argv else ["bash", "-c", script], cwd=cwd,
                              env=env, capture_output=True, text=True, timeout=600,
                              check=False)
        assert proc.returncode == 0, (script, proc.stdout[-2000:], proc.stderr[-2000:])
        out.append(proc.stdout)
    return "".join(out)


def _catalog(host: str) -> list[str]:
    with urllib.request.urlopen(f"http://{host}/v2/_catalog", timeout=10) as resp:
        return json.load(resp)["repositories"]


@needs_registry
@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_each_ci_file_runs_as_its_runner(ci, encoder_model, tmp_path):
    """Every shell step of the file, with the variables it sets (GitHub's expressions and
    GitLab's predefined variables filled in, an owner with capitals), in a fresh home;
    the install step is checked by :func:`test_the_install_line_builds_and_installs`."""
    encoded, public = _secrets(tmp_path)
    checkout = _checkout(tmp_path, encoder_model)
    env = _runner_env(tmp_path)
    with running_registry(tmp_path / "registry") as registry:
        if ci == "github":
            job = _github()
            context = {"github.repository": OWNER_REPO, "github.actor": "Some-User",
                       "secrets.WEIGHTSTORE_SIGNING_KEY_B64": encoded,
                       "vars.WEIGHTSTORE_TRUSTED_KEYS": public,
                       "secrets.GITHUB_TOKEN": "unused-by-this-registry"}
            env |= {name: _github_value(str(value), context).replace("ghcr.io", registry.host)
                    for name, value in job["env"].items()}
            env["GITHUB_REPOSITORY"] = OWNER_REPO
            # each run step: a script file run by bash -eo pipefail, as the runner does
            steps = [s["run"] for s in job["steps"] if "run" in s]
            commands = [(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"], s)
                        for s in steps if not INSTALL.search(s)]
        else:
            job = _gitlab()
            defined = {"CI_REGISTRY_IMAGE": f"{registry.host}/{OWNER_REPO.lower()}",
                       "CI_REGISTRY_USER": "gitlab-ci-token",
                       "CI_REGISTRY_PASSWORD": "unused-by-this-registry",
                       "WEIGHTSTORE_SIGNING_KEY_B64": encoded,  # the project's variables
                       "WEIGHTSTORE_TRUSTED_KEYS": public}
            env |= defined | {name: _gitlab_value(str(value), defined)
                              for name, value in job["variables"].items()}
            lines = [line for line in job["script"] if not INSTALL.search(line)]
            # one shell for the whole script, stopping at the first failing line
            commands = [(["bash", "-e", "-c"], "\n".join(lines))]
        assert "WEIGHTSTORE_SIGNING_KEY" not in env  # the base64 form is what signs
        assert any(INSTALL.search(s) for s in (job.get("script") or [
            s.get("run", "") for s in job["steps"]]))
        out = _run(commands, checkout, env)
        catalog = _catalog(registry.host)
    owner = OWNER_REPO.lower()
    assert f"{owner}/models" in catalog and f"{owner}/build-cache" in catalog, catalog
    assert "verified:" in out
    assert (checkout / "recipes" / "out" / "releases" / "pkg-1.0.0" /
            "release.intoto.jsonl").is_file()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the project's git checkout")
def test_the_install_line_builds_and_installs(tmp_path):
    """The files' install line is a pinned git URL of the project (it is not on PyPI) with
    the sign extra; pip builds that requirement (this checkout's committed tree at its
    commit standing in for the tag) into a wheel, which installs into a fresh venv whose
    ``weightstore`` runs the key example of the README and the release tutorial on a fresh
    home. Costs a wheel build
    (about 4 s)."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml (Python 3.11 on)")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = _install_lines()
    assert len(lines) == 2 and lines[0] == lines[1], lines  # one line for both files
    requirement = Requirement(INSTALL.search(lines[0]).group("requirement"))
    assert requirement.name == project["name"] and requirement.extras == {"sign"}
    source = project["urls"]["Source"]
    assert requirement.url == f"git+{source}@v{project['version']}", requirement.url
    # the CI tutorial's snippets install it the same way, at the same tag
    tutorial = (ROOT / "docs" / "tutorials" / "ci-cache.md").read_text()
    snippets = re.findall(r'pip install "weightstore\[\w+\] @ ([^"]+)"', tutorial)
    assert len(snippets) >= 2 and set(snippets) == {requirement.url}, snippets
    assert "pip install 'weightstore[report]'" not in tutorial.split("## Reports in CI")[1][:800]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    local = f"{requirement.name}[sign] @ git+file://localhost{ROOT}@{commit}"
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), local], check=True,
                   capture_output=True, timeout=300)
    (wheel,) = wheels.glob("weightstore-*.whl")
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(fresh / "bin" / "python"),
                    "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    # its dependencies (and the sign extra's cryptography) from this environment
    site = next((fresh / "lib").glob("python3*/site-packages"))
    import cryptography

    (site / "dependencies.pth").write_text(str(Path(cryptography.__file__).parents[1]) + "\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{fresh / 'bin'}:/usr/bin:/bin"}
    where = subprocess.run([str(fresh / "bin" / "python"), "-c",
                            "import weightstore; print(weightstore.__file__)"], env=env, cwd=home,
                           check=True, capture_output=True, text=True).stdout
    assert where.startswith(str(site)), where
    key = home / ".config" / "weightstore" / "release.pem"
    made = subprocess.run(["bash", "-c", "weightstore key generate "
                           "~/.config/weightstore/release.pem"], env=env, cwd=home,  # the docs
                          capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("ed25519:")
    for folder in (home / ".config", home / ".config" / "weightstore"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    encoded = base64.b64encode(key.read_bytes()).decode()
    shown = subprocess.run(["weightstore", "key", "public"], capture_output=True, text=True,
                           env={**env, "WEIGHTSTORE_SIGNING_KEY_B64": encoded}, cwd=home,
                           check=True)
    assert shown.stdout == made.stdout


@needs_registry
def test_two_runners_with_empty_stores_share_the_cache(encoder_model, tmp_path):
    key = tmp_path / "ci.pem"
    public = generate(key)
    with running_registry(tmp_path / "registry") as registry:
        runs = []
        for name in ("a", "b"):
            checkout = make_checkout(tmp_path / name, encoder_model).parent
            env = {**os.environ, "WEIGHTSTORE_CACHE": f"{registry.host}/cache/ci",
                   "PUSH_REPOSITORY": f"{registry.host}/models/ci",
                   "WEIGHTSTORE_SIGNING_KEY": key.read_text(),
                   "WEIGHTSTORE_TRUSTED_KEYS": public.text,
                   "WEIGHTSTORE": f"{sys.executable} -m weightstore",
                   "XDG_CACHE_HOME": str(tmp_path / name / "user-cache"),
                   "XDG_CONFIG_HOME": str(tmp_path / name / "user-config"),
                   "WEIGHTSTORE_DIR": str(tmp_path / name / "default-store")}
            proc = subprocess.run(["bash", str(EXAMPLES / "ci.sh"), "recipe.yaml"],
                                  cwd=checkout, env=env, capture_output=True, text=True,
                                  timeout=600, check=False)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            runs.append((checkout, proc))
        (a, first), (b, second) = runs
        assert "fetched from the build cache" not in first.stdout
        assert second.stdout.count("fetched from the build cache") == 2, second.stdout
        assert "verified:" in second.stdout and "SHA256SUMS" not in second.stderr
        sums = [(c / "out" / "releases" / "pkg-1.0.0" / "SHA256SUMS").read_bytes()
                for c in (a, b)]
        assert sums[0] == sums[1]  # the same release from either runner
