"""The fleet simulator behind benchmarks/fleet_sim.py, one module per section: latency (the
model and its middleware), meter, job, run, limits, model (extrapolation) and report."""
