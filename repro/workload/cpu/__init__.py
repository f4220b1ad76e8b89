"""The CPU-only pieces of the workload: what lets MiCS run over gloo on a machine without GPUs.

Owns the transport adapter that gives gloo the tensor collectives NCCL has (gloo_transport.py)
and the shims DeepSpeed's CPU accelerator needs (shims.py). Never used on GPUs. Like the rest of
repro.workload it runs inside the envs: standard library, torch and deepspeed only.
"""
