"""The user's caches: what is remembered between builds so that unchanged work is skipped.

Payload keys of unchanged sources (:mod:`.payload_keys`), keys of derived weights
(:mod:`.derived_keys`), the up-to-date stamp of a whole build (:mod:`.build_stamp`) and
the action records of builds (:mod:`.build_actions`), and what a process keeps for later
ones (resolutions, verified package files: :mod:`.signed_records`); every entry is bound
to the user's own secret by :mod:`weightstore.store.mac`. Nothing is imported here: each
module loads on first use.
"""
