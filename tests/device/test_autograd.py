"""Autograd works above the device: grads on the device equal CPU grads."""

import torch


def _leaf(cpu):
    return cpu.clone().requires_grad_(True), cpu.to("spmd").requires_grad_(True)


def test_backward_gives_device_grads():
    x_cpu, x = _leaf(torch.randn(4, 3))
    (x_cpu.sin() * 3).sum().backward()
    (x.sin() * 3).sum().backward()
    assert x.grad.device.type == "spmd"
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)


def test_autograd_grad():
    x_cpu, x = _leaf(torch.randn(5))
    (g_cpu,) = torch.autograd.grad((x_cpu ** 2).sum(), x_cpu)
    (g,) = torch.autograd.grad((x ** 2).sum(), x)
    torch.testing.assert_close(g.cpu(), g_cpu)


def test_no_grad_and_detach():
    _, x = _leaf(torch.randn(3))
    with torch.no_grad():
        assert not (x * 2).requires_grad
    assert not x.detach().requires_grad


def test_grads_accumulate_across_backward_calls():
    x_cpu, x = _leaf(torch.randn(3))
    for _ in range(2):
        (x_cpu * x_cpu).sum().backward()
        (x * x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)


def test_matmul_chain_backward():
    a_cpu, a = _leaf(torch.randn(4, 5))
    b_cpu, b = _leaf(torch.randn(5, 3))
    (a_cpu @ b_cpu).relu().mean().backward()
    (a @ b).relu().mean().backward()
    torch.testing.assert_close(a.grad.cpu(), a_cpu.grad)
    torch.testing.assert_close(b.grad.cpu(), b_cpu.grad)
