"""Run-size defaults shared by the suite, the per-rank trainer and the cluster scripts.

Ten steps are enough: MiCS stock on the async transport is NaN from step 0, and the fp16
overflow storm skips every step from the first one (the reporter saw it within 10-20 iterations
of a far larger model). Every extra step costs about 0.4 s per run on 2 cores.
"""

DEFAULT_STEPS = 10
DEFAULT_SEED = 1234
DEFAULT_WORLD_SIZE = 4
