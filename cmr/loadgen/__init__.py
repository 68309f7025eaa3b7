"""Load generation and consistency measurement.

``cmr.loadgen.sim``: a simulated replicated store (seed 004's three-replica model of SimpleDB,
seed 002's latencies, a capacity limit) and an event loop with a virtual clock to run it fast.
``cmr.loadgen.consistency``: the meter, pure functions over recorded reads and writes
(freshness by lag, monotonic reads, read-your-writes, stale fraction, Γ).
"""
