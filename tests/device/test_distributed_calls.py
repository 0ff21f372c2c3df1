"""``torch.distributed``'s collectives given spmd tensors: refused, saying why.

An spmd tensor is one global value across every process, so a collective over
processes has nothing to combine (on a CPU copy it would count each process's identical
value again): the error says so, names the collective, and leaves the tensor as it was.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import torchspmd


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name, call", [
    ("allreduce", lambda x: dist.all_reduce(x)),
    ("broadcast", lambda x: dist.broadcast(x, 0)),
    ("allgather", lambda x: dist.all_gather([torch.empty_like(x), torch.empty_like(x)], x)),
])
def test_a_collective_on_an_spmd_tensor_says_it_is_already_global(group, name, call):
    x = torch.arange(4.).to(torchspmd.device())
    with pytest.raises(NotImplementedError, match=f"torch.distributed's {name} does not take "
                                                  "spmd tensors.*one global value"):
        call(x)
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_fsdp2_on_the_device_names_fsdpv2_in_place_of_its_streams(group):
    """``fully_shard`` wraps without complaint; its first forward asks the device module
    for a ``Stream``, which says what the spmd device lacks and what to use instead."""
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Linear(4, 2).to(torchspmd.device())
    fully_shard(model)
    with pytest.raises(AttributeError, match="no attribute 'Stream'.*SpmdFullyShardedDataParallel"):
        model(torch.ones(3, 4).to(torchspmd.device()))


def test_the_device_module_still_answers_hasattr():
    assert not hasattr(torch.spmd, "Stream") and hasattr(torch.spmd, "device_count")
