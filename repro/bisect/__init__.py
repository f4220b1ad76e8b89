"""Finding where a release changes MiCS's behaviour: bisect, survey and single probes.

Owns the pure search over an ordered list of candidates (search.py: knows nothing of Docker or
pip, tested with literal lists), one probe of one candidate env with its outcome -> good/bad/
unknown mapping (probe.py), DeepSpeed checkouts in place of a release for `git bisect run`
(source_overlay.py), the one driver shared by bisect and survey (driver.py) and what they print
and save (output.py).
"""
