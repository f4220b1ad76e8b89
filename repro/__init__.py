"""mics-repro: a reproduction lab for the DeepSpeed MiCS + torch>=2.1 `_IllegalWork` bug.

This file must stay free of imports: the image and venv runs import `repro.workload`,
which pulls this package in, and those environments have only torch and deepspeed.
"""

__version__ = "0.1.0"
