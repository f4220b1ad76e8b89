"""What every layer of the host side shares; imports nothing above it (only repro.workload's types).

Owns the error hierarchy with what/why/fix and exit codes (errors.py), the one door for
subprocesses (cmd.py), console output and its --quiet/--verbose levels (console.py), where things
live (paths.py), signal handling (signals.py), the results store and the typed view of a run
record (results.py, runs.py), which platform a run is evidence for (evidence.py), THE env verdict
used by the summary, check-fix, the report, the issue comment and the bundle (verdict.py), and the
one builder of "the make line that reproduces this" (makeline.py).
"""
