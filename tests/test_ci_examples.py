"""examples/ci: the CI files parse and call the one script, and the script runs as two CI
runners would, each with an empty store, against a real registry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.registry_server import needs_registry, running_registry
from tests.release_helpers import make_checkout
from weightstore.signing.keys import generate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "ci"
SCRIPT = "examples/ci/ci.sh"


def test_the_ci_files_parse_and_call_the_script():
    github = yaml.safe_load((EXAMPLES / "github-actions.yml").read_text())
    steps = github["jobs"]["package"]["steps"]
    assert any(SCRIPT in s.get("run", "") for s in steps)
    gitlab = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())
    assert any(SCRIPT in line for line in gitlab["package"]["script"])
    for doc, variables in ((github, gitlab["package"]["variables"]),):
        env = doc["jobs"]["package"]["env"]
        for name in ("WEIGHTSTORE_CACHE", "PUSH_REPOSITORY"):  # what the script needs
            assert name in env and name in variables
        # GitHub names its secrets in the file; GitLab's are the project's CI/CD variables
        assert "secrets.WEIGHTSTORE_SIGNING_KEY" in env["WEIGHTSTORE_SIGNING_KEY"]
        assert "WEIGHTSTORE_TRUSTED_KEYS" in env
    assert os.access(EXAMPLES / "ci.sh", os.X_OK)


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
