# Copyright (c) Microsoft Corporation.
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Regression tests for MiCS parameter gathers on torch >= 2.1 (deepspeedai/DeepSpeed#5080).

From torch 2.1, a collective issued inside ``_coalescing_manager`` returns an ``_IllegalWork``
placeholder; the real work belongs to the manager object. ``TorchBackend.all_gather_coalesced``
must hand back (or wait) that real work, and ``MiCS_AllGatherCoalescedHandle.wait`` must not
mark parameters AVAILABLE when the wait failed.
"""

import pytest
import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero.mics import MiCS_AllGatherCoalescedHandle
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from unit.common import DistributedTest

# Uneven sizes: each tensor of a coalesced group must land in its own output.
SIZES = (3, 8, 5)
HIDDEN = 8


def _coalesced_tensors():
    rank, world = dist.get_rank(), dist.get_world_size()
    device = get_accelerator().current_device_name()
    inputs = [torch.full((n, ), float(10 * (rank + 1) + i), device=device) for i, n in enumerate(SIZES)]
    outputs = [torch.empty(n * world, device=device) for n in SIZES]
    expected = [
        torch.cat([torch.full((n, ), float(10 * (r + 1) + i)) for r in range(world)]).to(device)
        for i, n in enumerate(SIZES)
    ]
    return inputs, outputs, expected


def _mics_config(shard_size):
    return {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {
            "stage": 3,
            "mics_shard_size": shard_size,
            "mics_hierarchical_params_gather": False,
        },
    }


class _KnownWeights(torch.nn.Module):
    """Weights with values every rank knows without communicating."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.arange(HIDDEN * HIDDEN, dtype=torch.float32).view(HIDDEN, HIDDEN))
        self.b = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3 * HIDDEN))


def _known_weights():
    reference = _KnownWeights()
    return [reference.a.detach().clone(), reference.b.detach().clone()]


class _FailingWork:
    """A work whose wait fails, as a placeholder's or a broken collective's does."""

    def wait(self):
        raise RuntimeError("simulated failed wait")


class TestAllGatherCoalesced(DistributedTest):
    world_size = 2

    @pytest.mark.parametrize("async_op", [True, False])
    def test_gathers_every_tensor(self, async_op):
        inputs, outputs, expected = _coalesced_tensors()
        handle = dist.all_gather_coalesced(outputs, inputs, async_op=async_op)
        if async_op:
            assert handle is not None, "async_op=True must return something to wait on"
            # On torch >= 2.1 this raised "Illegal to call wait on IllegalWork object" (RuntimeError
            # on 2.1, ValueError on 2.2+): the returned handle was a placeholder, not the gather.
            handle.wait()
        get_accelerator().synchronize()
        for i, (out, want) in enumerate(zip(outputs, expected)):
            assert torch.equal(out, want), f"tensor {i} of the coalesced gather: got {out}, expected {want}"


class TestMiCSFlatAllGather(DistributedTest):
    world_size = 2

    def test_gather_waits_for_real_work(self):
        with deepspeed.zero.MiCS_Init(config_dict_or_path=_mics_config(self.world_size)):
            model = _KnownWeights()
        params = [model.a, model.b]
        assert all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in params)

        handle = params[0].all_gather_coalesced(params)
        handle.wait()
        # The work MiCS keeps must be the gather itself. A placeholder made handle.wait() a no-op
        # (its exception was logged and swallowed) and compute read buffers still being filled.
        handle.allgather_handle.wait()
        get_accelerator().synchronize()

        assert all(p.ds_status == ZeroParamStatus.AVAILABLE for p in params)
        for p, want in zip(params, _known_weights()):
            assert torch.equal(p.data.cpu(), want), f"gathered parameter {p.ds_id} differs from its value"

    def test_failed_wait_is_raised(self):
        with deepspeed.zero.MiCS_Init(config_dict_or_path=_mics_config(self.world_size)):
            model = _KnownWeights()
        params = [model.a, model.b]
        for p in params:
            p.ds_status = ZeroParamStatus.INFLIGHT
        handle = MiCS_AllGatherCoalescedHandle(allgather_handle=_FailingWork(),
                                               params=params,
                                               partitions=[],
                                               world_size=self.world_size)

        with pytest.raises(RuntimeError, match="simulated failed wait"):
            handle.wait()
        # Marking them AVAILABLE would let the next forward compute on data that never arrived.
        assert all(p.ds_status == ZeroParamStatus.INFLIGHT for p in params)
        for p in params:
            p.ds_status = ZeroParamStatus.NOT_AVAILABLE
