"""GPT-2's ``lm_head`` stays tied to its token embedding on the device, with and without FSDPv2."""

import functools

import numpy as np
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

import torchspmd
from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
from torchspmd.sharding import Mesh

from tests.hf.models import cpu_and_copy, tiny_gpt2
from tests.hf.test_training import shard_logits


def test_to_device_keeps_lm_head_tied_to_the_embedding():
    _, model = cpu_and_copy(tiny_gpt2)
    model.to(torchspmd.device())
    assert model.lm_head.weight is model.transformer.wte.weight


def test_fsdpv2_auto_wrap_keeps_lm_head_tied_to_the_embedding():
    _, model = cpu_and_copy(tiny_gpt2)
    block = type(model.transformer.h[0])
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={block})
    wrapped = FSDPv2(model, mesh=Mesh(np.arange(8), (8,), ("fsdp",)), shard_output=shard_logits,
                     auto_wrap_policy=policy)
    inner = wrapped.module
    assert inner.lm_head.weight is inner.transformer.wte.weight
