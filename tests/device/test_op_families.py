"""Op families end to end on the device (forward and backward), compared with CPU."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchspmd


def _run_both(module: nn.Module, *inputs, loss=lambda out: out.float().square().mean()):
    """Forward + backward on CPU and on the device; returns (cpu, spmd) outputs and grads."""
    results = []
    for device in ("cpu", "spmd"):
        m = copy.deepcopy(module).to(device)
        args = [x.to(device) for x in inputs]
        out = m(*args)
        loss(out).backward()
        grads = [p.grad.cpu() for p in m.parameters()]
        results.append((out.cpu() if device == "spmd" else out, grads))
    return results


def _assert_same(results, atol=1e-5, rtol=1e-4):
    (cpu_out, cpu_grads), (out, grads) = results
    torch.testing.assert_close(out, cpu_out.detach(), atol=atol, rtol=rtol)
    for g, cg in zip(grads, cpu_grads):
        torch.testing.assert_close(g, cg, atol=atol, rtol=rtol)


class _Lambda(nn.Module):
    def __init__(self, fn, *params):
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList(params)

    def forward(self, *xs):
        return self.fn(*xs, *self.params)


@pytest.mark.parametrize("name,module,shape", [
    ("conv1d", nn.Conv1d(3, 4, 3, padding=1), (2, 3, 10)),
    ("conv2d", nn.Conv2d(3, 4, 3, stride=2, padding=1), (2, 3, 9, 9)),
    ("conv2d-groups", nn.Conv2d(4, 4, 3, groups=2, dilation=2), (1, 4, 9, 9)),
    ("maxpool", nn.Sequential(nn.Conv2d(2, 2, 1), nn.MaxPool2d(2)), (2, 2, 8, 8)),
    ("avgpool", nn.Sequential(nn.Conv2d(2, 2, 1), nn.AvgPool2d(3, stride=2)), (2, 2, 9, 9)),
    ("batchnorm", nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)), (5, 6)),
    ("groupnorm", nn.GroupNorm(2, 4), (3, 4, 5)),
    ("layernorm", nn.LayerNorm(8), (3, 8)),
    ("rmsnorm", nn.RMSNorm(8), (3, 8)),
    ("activations", nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.SiLU(),
                                  nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Sigmoid()),
     (4, 8)),
    ("gelu-tanh", nn.Sequential(nn.Linear(8, 8), nn.GELU("tanh")), (4, 8)),
])
def test_module_forward_and_backward(name, module, shape):
    torch.manual_seed(0)
    _assert_same(_run_both(module, torch.randn(*shape)))


@pytest.mark.parametrize("kind", ["plain", "causal", "bool-mask", "float-mask"])
def test_scaled_dot_product_attention(kind):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = {"bool-mask": torch.rand(5, 5) > 0.3, "float-mask": torch.randn(5, 5)}.get(kind)

    def attend(q, k, v, w):
        m = None if mask is None else mask.to(q.device)
        return F.scaled_dot_product_attention(q * w, k, v, attn_mask=m, is_causal=kind == "causal")

    _assert_same(_run_both(_Lambda(attend, nn.Parameter(torch.ones(8))), q, k, v))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_ignore_index_and_smoothing(reduction):
    torch.manual_seed(0)
    target = torch.tensor([1, 0, 4, -100, 2])

    def loss(logits, w):
        return F.cross_entropy(logits * w, target.to(logits.device), ignore_index=-100,
                               label_smoothing=0.1, reduction=reduction)

    _assert_same(_run_both(_Lambda(loss, nn.Parameter(torch.ones(5))), torch.randn(5, 5)))


def test_embedding_and_mse():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    idx = torch.tensor([[1, 2, 2], [9, 0, 1]])
    _assert_same(_run_both(emb, idx, loss=lambda out: F.mse_loss(out, torch.ones_like(out))))


def test_reductions_and_indexing():
    x = torch.randn(4, 6)
    d = x.to("spmd")
    checks = [
        (lambda t: t.max(dim=1).indices, None), (lambda t: t.logsumexp(1), None),
        (lambda t: t.var(0, correction=1), None), (lambda t: t.cumsum(1), None),
        (lambda t: t[torch.tensor([0, 2]).to(t.device), 1:4], None),
        (lambda t: t.gather(1, torch.tensor([[0], [5], [2], [1]]).to(t.device)), None),
        (lambda t: torch.where(t > 0, t, t * 0.1), None),
        (lambda t: torch.cat([t, t.flip(0)], 1).roll(2, 1).tril(), None),
        (lambda t: t.masked_fill(t < 0, float("-inf")).softmax(-1), None),
        (lambda t: F.pad(t, (1, 2)).repeat(2, 1).std(), None),
        (lambda t: torch.einsum("ij,kj->ik", t, t), None),
    ]
    for fn, _ in checks:
        torch.testing.assert_close(fn(d).cpu(), fn(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_steps_match_cpu(optimizer, foreach):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    kwargs = {"lr": 0.05, "foreach": foreach}
    if optimizer == "SGD":
        kwargs.update(momentum=0.9, nesterov=True, weight_decay=0.01)
    x, y = torch.randn(6, 4), torch.randn(6, 2)
    params = []
    for device in ("cpu", "spmd"):
        m = copy.deepcopy(model).to(device)
        opt = getattr(torch.optim, optimizer)(m.parameters(), **kwargs)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(m(x.to(device)), y.to(device)).backward()
            opt.step()
        torchspmd.sync()
        params.append([p.detach().cpu() for p in m.parameters()])
    for a, b in zip(*params):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
