"""DSSE envelopes (Dead Simple Signing Envelope, v1), as in-toto attestations carry them.

An envelope signs ``PAE(payloadType, payload)``::

    "DSSEv1" SP len(type) SP type SP len(payload) SP payload

(lengths in ASCII decimal), and is the JSON object ``{"payload": base64, "payloadType":
type, "signatures": [{"keyid": id, "sig": base64}]}``. An attestation bundle
(``*.intoto.jsonl``) holds one envelope per line. Ed25519 signatures are deterministic,
so the same payload signed with the same key gives the same envelope.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from ..errors import SignatureError
from ..io.files import parse_json
from .keys import PrivateKey, PublicKey

IN_TOTO = "application/vnd.in-toto+json"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def envelope(payload: bytes, key: PrivateKey, payload_type: str = IN_TOTO) -> dict[str, Any]:
    sig = key.sign(pae(payload_type, payload))
    return {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
            "signatures": [{"keyid": key.public.keyid, "sig": base64.b64encode(sig).decode()}]}


def bundle_line(doc: dict[str, Any]) -> bytes:
    """One line of an attestation bundle (``.intoto.jsonl``)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def open_envelope(doc: object, keys: Sequence[PublicKey],
                  payload_type: str = IN_TOTO) -> tuple[bytes, PublicKey]:
    """The payload of envelope ``doc`` and the key of ``keys`` whose signature on it
    verifies; a :class:`SignatureError` saying why not otherwise (malformed, another
    payload type, unsigned, signed by no key given, a signature that does not verify)."""
    try:
        assert isinstance(doc, dict)
        payload = base64.b64decode(doc["payload"], validate=True)
        kind = doc["payloadType"]
        signatures = doc["signatures"]
        assert isinstance(kind, str) and isinstance(signatures, list)
    except (AssertionError, KeyError, TypeError, ValueError):
        raise SignatureError("not a DSSE envelope") from None
    if kind != payload_type:
        raise SignatureError("the envelope carries another payload type",
                             payload_type=kind)
    if not signatures:
        raise SignatureError("the envelope is not signed")
    by_id = {k.keyid: k for k in keys}
    message = pae(kind, payload)
    known = False
    for s in signatures:
        key = by_id.get(s.get("keyid")) if isinstance(s, dict) else None
        if key is None:
            continue
        known = True
        try:
            sig = base64.b64decode(s.get("sig", ""), validate=True)
        except (TypeError, ValueError):
            continue
        if key.verifies(sig, message):
            return payload, key
    if not known:
        raise SignatureError("signed by no trusted key", keyids=", ".join(
            str(s.get("keyid")) for s in signatures if isinstance(s, dict)))
    raise SignatureError("the signature does not verify")


def read_bundle(data: bytes) -> list[object]:
    """The envelopes of an attestation bundle, one JSON object per non-empty line."""
    out = []
    for n, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                out.append(parse_json(line))
            except ValueError:
                raise SignatureError("a line of the attestation bundle is not JSON",
                                     line=n) from None
    return out
