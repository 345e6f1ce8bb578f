"""A package folder's records: its ``summary.json`` (:mod:`.summary`), its weight files as
store payloads at offsets (:mod:`.assembly`), the device bundle records
(:mod:`.bundle_record`) and the build fingerprint with the source-digest cache it feeds
(:mod:`.fingerprint`). Every layer above reads them; what is done to package folders is
:mod:`weightstore.packaging`.

Nothing is imported here: each module loads on first use (see :mod:`weightstore.lazy`).
"""
