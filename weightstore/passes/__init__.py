"""Rewrite passes: each turns a metadata model into LocalRewriting records."""
