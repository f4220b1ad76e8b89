"""One reproduction run: Request -> plan -> execute -> summary.

Owns turning a typed request into a list of frozen steps and walking it with an engine
(orchestrate.py), the summary table and verdict lines printed at the end of every invocation
(summary.py, reading repro.core.verdict) and the speed benchmark (bench.py).
"""
