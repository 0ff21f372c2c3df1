"""``Module.to("spmd")`` keeps parameters that submodules share (tied weights) shared, as CUDA does."""

import torch
from torch import nn

import torchspmd


class TiedHead(nn.Module):
    """An embedding whose weight is also the output projection (GPT-2, BERT, T5)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


def test_to_device_keeps_a_tied_weight_one_parameter():
    model = TiedHead().to(torchspmd.device())
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 1


def test_to_device_keeps_a_shared_buffer_one_tensor():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.BatchNorm1d(3))
    model[1].running_mean = model[0].running_mean
    model.to(torchspmd.device())
    assert model[1].running_mean is model[0].running_mean


def test_untied_weights_stay_separate():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)).to(torchspmd.device())
    assert model[0].weight is not model[1].weight


def test_a_tied_weight_trains_as_one_weight_like_cpu():
    torch.manual_seed(0)
    cpu = TiedHead()
    dev = TiedHead()
    dev.load_state_dict(cpu.state_dict())
    dev.to(torchspmd.device())
    ids = torch.tensor([1, 2, 3, 4])
    for model, device in ((cpu, "cpu"), (dev, torchspmd.device())):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            model(ids.to(device)).logsumexp(-1).sum().backward()
            opt.step()
    torch.testing.assert_close(dev.embed.weight.cpu(), cpu.embed.weight, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dev.head.weight.cpu(), cpu.head.weight, atol=1e-6, rtol=1e-6)
