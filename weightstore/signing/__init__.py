"""Signatures: Ed25519 keys (:mod:`.keys`) and DSSE envelopes (:mod:`.dsse`), which sign
release provenance. Nothing is imported here: each module loads on first use."""
