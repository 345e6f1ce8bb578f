"""What a Python process costs that only downloads an artifact: the floor a pull in
Python stands on, for ``bench/registry.py``'s comparison with skopeo.

Usage: ``python bench/pull_floor.py HOST/REPOSITORY:TAG DIR [--threads 8]``

The manifest, then the config and every layer over kept-alive plain-HTTP connections
(``--threads`` at once, each thread its own connection), each blob's sha256 checked as
it streams into ``DIR/<hex>`` and the file fsynced: what ``skopeo copy docker://...
oci:DIR`` does, with the standard library that ``weightstore pull`` uses
(``http.client``, ``hashlib``, ``concurrent.futures``). No store, no key, no package
folder, no lock, no summary, no resume, no error handling beyond a wrong digest: it is a
measurement, not a client.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference")
    parser.add_argument("folder")
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    host, rest = args.reference.split("/", 1)
    repository, tag = rest.rsplit(":", 1)
    local = threading.local()

    def get(path: str, accept: str = "*/*") -> http.client.HTTPResponse:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(host, timeout=30)
        conn.request("GET", f"/v2/{repository}/{path}", headers={"Accept": accept})
        resp = conn.getresponse()
        if resp.status != 200:
            raise SystemExit(f"GET {path}: HTTP {resp.status}")
        return resp

    manifest = json.loads(get(f"manifests/{tag}", MANIFEST).read())
    os.makedirs(args.folder)

    def fetch(digest: str) -> None:
        hasher = hashlib.sha256()
        with get(f"blobs/{digest}") as resp, \
                open(os.path.join(args.folder, digest.split(":")[1]), "wb") as f:
            while data := resp.read1(1 << 20):
                hasher.update(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if "sha256:" + hasher.hexdigest() != digest:
            raise SystemExit(f"{digest}: wrong bytes")

    digests = [manifest["config"]["digest"], *(x["digest"] for x in manifest["layers"])]
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(fetch, digests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
