"""Run-size defaults shared by the suite, the per-rank trainer and the cluster scripts.

Ten steps are enough: MiCS stock on the async transport is NaN from step 0, and the fp16
overflow storm skips every step from the first one (the reporter saw it within 10-20 iterations
of a far larger model). Every extra step costs about 0.4 s per run on 2 cores.
"""

DEFAULT_STEPS = 10
DEFAULT_SEED = 1234
DEFAULT_WORLD_SIZE = 4

# Stopping runs (repro/workload/runner.py): each step of interrupt -> terminate -> kill waits
# RANK_STOP_GRACE_S; a hung run first gets STACK_WAIT_S for its ranks' stacks.
RANK_STOP_GRACE_S = 5.0
STACK_WAIT_S = 3.0
# The longest the suite may take, once asked to stop, until no rank of any run is left: runs stop
# in parallel, each at worst stacks + three steps. Whoever stops the suite (the host's
# repro/core/cmd.py, the Docker engine) must give it longer than this, or the suite is killed
# before it has killed stubborn ranks and written their records.
SUITE_STOP_S = STACK_WAIT_S + 3 * RANK_STOP_GRACE_S
