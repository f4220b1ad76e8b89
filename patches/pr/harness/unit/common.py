"""The part of DeepSpeed's tests/unit/common.py the PR regression test uses, written for CPU runs.

Not DeepSpeed's module: a minimal stand-in with the same name and surface (`DistributedTest` with a
`world_size`), so that patches/pr/tests/... runs unchanged in DeepSpeed's tree (with their launcher)
and here (with ours, `mics_pr_plugin`, which launches one process per rank over gloo with the
project's CPU transport).
"""


class DistributedTest:
    """Marks a test class whose methods run once in each of `world_size` ranks."""

    is_dist_test = True
    world_size = 2
