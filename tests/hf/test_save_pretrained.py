"""``save_pretrained`` of a model on the spmd device, sharded or not, writes what the CPU
model writes: Hugging Face groups a state dict's tensors by storage
(``untyped_storage().data_ptr()``) to find tied weights, which raised "invalid python
storage" for spmd tensors. Reloaded on the CPU, every tensor equals the CPU model's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import Mesh, mark_sharding

from tests.hf.models import cpu_and_copy, tiny_gpt2, tiny_llama


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2 (tied lm_head)"])
@pytest.mark.parametrize("sharded", [False, True], ids=["replicated", "sharded"])
def test_save_pretrained_from_the_device_reloads_equal_to_cpu(make, sharded, tmp_path):
    cpu, model = cpu_and_copy(make)
    model.to(torchspmd.device())
    if sharded:
        mesh = Mesh(np.arange(8), (8,), ("fsdp",))
        for p in model.parameters():
            if p.dim() == 2 and p.shape[0] % 8 == 0:
                mark_sharding(p, mesh, ("fsdp", None))
    model.save_pretrained(tmp_path / "spmd")
    cpu.save_pretrained(tmp_path / "cpu")
    reloaded = type(cpu).from_pretrained(tmp_path / "spmd")
    expected = type(cpu).from_pretrained(tmp_path / "cpu")
    assert reloaded.state_dict().keys() == expected.state_dict().keys()
    for (name, p), q in zip(reloaded.state_dict().items(), expected.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    if make is tiny_gpt2:
        assert reloaded.lm_head.weight is reloaded.transformer.wte.weight


def test_views_of_one_storage_share_its_key_and_other_storages_do_not():
    a = torch.arange(6.0).to(torchspmd.device())
    b = torch.arange(6.0).to(torchspmd.device())
    key = a.untyped_storage().data_ptr()
    assert a[2:].untyped_storage().data_ptr() == key == a.view(2, 3).untyped_storage().data_ptr()
    assert b.untyped_storage().data_ptr() != key
    assert a.untyped_storage().nbytes() == 24
