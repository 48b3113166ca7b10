"""The benchmark suite behind ``benchmarks/run.py``: fedlightning side by side with its peers.

Modules: :mod:`.workloads` (S0..S7 and their FLOPs), :mod:`.measure` (PSS of a process tree,
CPU time, foreign load, the matmul rate that sets the compute floor), :mod:`.peers` (virtual
environments and launch commands of the plain loop, pfl-research and Flower), :mod:`.report`
(JSON and the Markdown table), and ``systems/`` (the scripts each system runs in its own
process; they share :mod:`.systems.common` and print one JSON result).
"""
