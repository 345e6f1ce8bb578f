#!/usr/bin/env bash
# One CI job of a model repository: build with the shared, signed build cache, push every
# package to the registry, release with signed provenance and check it.
#
#   examples/ci/ci.sh RECIPE
#
# The job's environment (CI variables and secrets):
#   WEIGHTSTORE_CACHE         the cache repository, host/name (read and written)
#   WEIGHTSTORE_SIGNING_KEY_B64  the Ed25519 private key that signs cache entries and the
#                             release provenance: its PEM base64 on one line (base64 -w0
#                             ci.pem), a secret the CI masks (or the PEM itself in
#                             WEIGHTSTORE_SIGNING_KEY, where the secret store keeps new lines)
#   WEIGHTSTORE_TRUSTED_KEYS  the public keys (ed25519:<hex>) whose cache entries are used
#   PUSH_REPOSITORY           where packages go: host/name, one tag per layout and version
#                             (both repositories are lower-cased here: OCI refuses capitals,
#                             which a GitHub owner or repository may have)
#   WEIGHTSTORE_REGISTRY_USERNAME, WEIGHTSTORE_REGISTRY_PASSWORD: the registry's login
# Each runner may start with an empty store: what another runner built is fetched, not
# converted again.
set -euo pipefail

recipe=${1:?usage: ci.sh RECIPE}
: "${WEIGHTSTORE_CACHE:?set WEIGHTSTORE_CACHE to the cache repository}"
: "${PUSH_REPOSITORY:?set PUSH_REPOSITORY to the repository packages are pushed to}"
WEIGHTSTORE_CACHE=$(printf %s "$WEIGHTSTORE_CACHE" | tr '[:upper:]' '[:lower:]')
PUSH_REPOSITORY=$(printf %s "$PUSH_REPOSITORY" | tr '[:upper:]' '[:lower:]')
export WEIGHTSTORE_CACHE
ws=${WEIGHTSTORE:-weightstore}
# the release's archives carry the commit's time, so a rebuild of the commit is identical
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
export SOURCE_DATE_EPOCH

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

$ws build "$recipe" --json > "$work/build.json"   # fetched from the cache, or converted
python3 - "$work/build.json" > "$work/packages.txt" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))["packages"]:
    s = p["summary"]
    print(p["path"], f'{s["layout"]["name"]}-{s["version"]}', p["cache"] or "-")
PY
while read -r folder tag cache; do
  [ "$cache" = - ] || echo "$folder: fetched from the build cache $cache"
  $ws push "$folder" "$PUSH_REPOSITORY:$tag"
done < "$work/packages.txt"

release=$($ws release "$recipe" --sign --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["output"])')
$ws release --verify "$release"
(cd "$release" && sha256sum -c SHA256SUMS)
