"""The artifacts room (N2): content-addressed blobs a node saves and its consumers read.

:mod:`~charter.artifacts.objects` is the object store: sha256-addressed, a
local directory by default, behind a small protocol; paths come only from the
hash, and nothing outside its root is ever read or written.
:mod:`~charter.artifacts.workspace` puts an artifact back where a node expects
it. :mod:`~charter.artifacts.store` owns the ``artifacts`` table: which run
saved what under which name.
"""
