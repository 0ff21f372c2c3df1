"""``model.gradient_checkpointing_enable()`` trains a tiny Llama on the device as on the CPU."""

import numpy as np
import pytest

import torchspmd

from tests.hf.models import cpu_and_copy, tiny_llama, train


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_gradient_checkpointing_matches_cpu(use_reentrant):
    cpu, model = cpu_and_copy(tiny_llama)
    kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": use_reentrant}}
    cpu.gradient_checkpointing_enable(**kwargs)
    model.gradient_checkpointing_enable(**kwargs)
    cpu.train()
    model.train()
    cpu_losses, _ = train(cpu, "cpu", steps=4)
    losses, compiled = train(model.to(torchspmd.device()), torchspmd.device(), steps=4)
    np.testing.assert_allclose(losses, cpu_losses, atol=1e-4, rtol=1e-4)
    assert sum(compiled[3:]) == 0, compiled
