"""The workload that runs inside every environment (container or venv).

Depends only on the Python standard library, torch and deepspeed. Nothing here may import
from the host-side modules of `repro` (docker, jinja2, matplotlib are not in the images).
"""
