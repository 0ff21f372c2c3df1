"""``torch.utils.checkpoint``: recomputation in backward, on CPU tensors and on the device."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchspmd
from torchspmd.runtime.execute import last_program


def block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


def grads(model: nn.Module, x: torch.Tensor, **checkpoint_args) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = checkpoint(model, x, **checkpoint_args) if checkpoint_args else model(x)
    out.square().sum().backward()
    return [x.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]


def test_checkpoint_on_cpu_tensors_works_with_torchspmd_imported():
    # checkpoint saves the autocast state of every device type, the spmd one included.
    x = torch.randn(4, 8)
    expected = grads(block(), x)
    for actual, want in zip(grads(block(), x, use_reentrant=False), expected):
        torch.testing.assert_close(actual, want)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_on_the_device_gives_cpus_gradients(use_reentrant):
    x = torch.randn(4, 8)
    expected = grads(block(), x)
    actual = grads(block().to(torchspmd.device()), x.to(torchspmd.device()),
                   use_reentrant=use_reentrant)
    for a, want in zip(actual, expected):
        torch.testing.assert_close(a, want, atol=1e-5, rtol=1e-5)


class DeepMLP(nn.Module):
    """Residual blocks ``x + W2 gelu(W1 x)``, each checkpointed or not."""

    def __init__(self, checkpointed: bool, use_reentrant: bool, blocks: int = 4, dim: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            for _ in range(blocks))
        self.checkpointed, self.use_reentrant = checkpointed, use_reentrant

    def forward(self, x):
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=self.use_reentrant)
                     if self.checkpointed else block(x))
        return x


def step_temp_bytes_and_loss(model: nn.Module, x: torch.Tensor) -> tuple[int, float]:
    """One SGD step as one program: XLA's temporary bytes for it, and the loss."""
    loss = model(x).square().mean()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    torchspmd.sync()
    return last_program().memory_analysis().temp_size_in_bytes, loss.item()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointing_needs_less_temporary_memory_for_the_same_loss(use_reentrant):
    # Without fencing the recomputation, XLA merges it with the forward (common
    # subexpressions) and the checkpointed step needs as much memory as the plain one.
    x = torch.randn(256, 16).to(torchspmd.device()).requires_grad_()
    plain, plain_loss = step_temp_bytes_and_loss(
        DeepMLP(False, use_reentrant).to(torchspmd.device()), x)
    checkpointed, checkpointed_loss = step_temp_bytes_and_loss(
        DeepMLP(True, use_reentrant).to(torchspmd.device()), x)
    assert checkpointed < 0.6 * plain
    assert checkpointed_loss == pytest.approx(plain_loss, rel=1e-6)
