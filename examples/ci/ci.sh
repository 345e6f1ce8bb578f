#!/usr/bin/env bash
# One CI job of a model repository: build with the shared, signed build cache, push every
# package to the registry, release with signed provenance and check it.
#
#   examples/ci/ci.sh RECIPE
#
# The job's environment (CI variables and secrets):
#   WEIGHTSTORE_CACHE         the cache repository, host/name (read and written)
#   WEIGHTSTORE_SIGNING_KEY   the Ed25519 private key (PEM) that signs cache entries and
#                             the release provenance (a secret)
#   WEIGHTSTORE_TRUSTED_KEYS  the public keys (ed25519:<hex>) whose cache entries are used
#   PUSH_REPOSITORY           where packages go: host/name, one tag per layout and version
#   WEIGHTSTORE_REGISTRY_USERNAME, WEIGHTSTORE_REGISTRY_PASSWORD: the registry's login
# Each runner may start with an empty store: what another runner built is fetched, not
# converted again.
set -euo pipefail

recipe=${1:?usage: ci.sh RECIPE}
: "${WEIGHTSTORE_CACHE:?set WEIGHTSTORE_CACHE to the cache repository}"
: "${PUSH_REPOSITORY:?set PUSH_REPOSITORY to the repository packages are pushed to}"
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
