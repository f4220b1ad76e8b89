"""Handing the reproduction upstream: to DeepSpeed maintainers, to clusters, as a pull request.

Each subpackage is one thing the lab hands out:

- `bundle/`: a container and a ready-to-paste comment for maintainers (`make bundle`), and
  its offline check (`make verify-bundle`);
- `issue/`: ISSUE.md for the tracker from a run, survey or bisect folder (`make issue`);
- `cluster/`: scripts for clusters without Docker (`make cluster`) and the stdlib-only summary
  they ship;
- `pr/`: the fix as a branch of a DeepSpeed checkout with its regression test (`make pr`), its
  verification in the lab and under DeepSpeed's own tests (`make pr-verify`), PR_DESCRIPTION.md.

Shared by them: `patchgen.py` (the shipped patches) and the Jinja templates (`templates/`).
"""
