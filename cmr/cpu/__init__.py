"""The pool side: the code that runs in the worker processes of a CpuPool (:mod:`cmr.pool`).

The event loop only moves bytes; user code, combining, partitioning, (de)serialising and
compression happen here, one task per pool process, so every core works. Results go
through local spool files rather than return values, which keeps a task's memory bounded
by its buffers, not by its output. User exceptions are caught here and returned as text,
never re-raised across the process boundary.

One module per concern, each imported from where its concept lives (nothing is re-exported
here, so importing the package costs nothing):

- :mod:`~cmr.cpu.specs`: what a task is told (MapSpec, ReduceSpec), built from a JobSpec
- :mod:`~cmr.cpu.results`: what a task hands back, and its errors captured as text
- :mod:`~cmr.cpu.instances`: the job instances a pool process keeps, and their steps
- :mod:`~cmr.cpu.mapping`: the map half (reading, map and map_chunk, combining)
- :mod:`~cmr.cpu.shuffle`: partitioning, combining and packing a map task's batches
- :mod:`~cmr.cpu.order`: the order of keys and values at reduce
- :mod:`~cmr.cpu.runs`: a reducer's spools read, spilled as sorted runs and merged
- :mod:`~cmr.cpu.reducing`: the reduce half (grouping, reduce, the output file)
- :mod:`~cmr.cpu.fixedsort`: fixed-length records sorted as arrays (TeraSort; numpy)
"""
