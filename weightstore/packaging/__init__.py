"""What is done to package folders: writing one (:mod:`.write`), proving it is the build its
store recorded and verifying it against its summary (:mod:`.proof`, :mod:`.inventory`),
a warm build from the store by its action record (:mod:`.materialize`), checking what
each device and scenario needs (:mod:`.check`), and the device bundles (:mod:`.bundles`).
A package's own records (summary, assembly, bundle records, fingerprint) are
:mod:`weightstore.package`'s, below the caches and resolution these operations use.

Nothing is imported here: each module loads on first use (see :mod:`weightstore.lazy`).
"""
