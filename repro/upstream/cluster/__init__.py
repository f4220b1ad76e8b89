"""Scripts for clusters without Docker (`make cluster`).

- `scripts.py`: the Slurm batch and per-node launch scripts, every value quoted or refused;
- `summary.py`: the standard-library-only summary the scripts ship and run on the cluster.
"""
