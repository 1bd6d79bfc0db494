"""The ground floor every package stands on: typed errors, SQLite storage, terminal display, process set-up.

It imports nothing else of AnonML. ``anonml`` itself (``anonml/``) is the top
floor: the ``anonml`` command, the demo, the benchmarks, the fuzzers and the
test helpers; the roles and their shared vocabulary sit between the two.
"""
