"""A compiled module that returns tensors with autograd history and runs no backward
(``torchspmd.compile(model)`` as ``torch.compile(model)`` is used) says at its capture
that its results have none, and what to compile instead; training steps, evaluation
under ``torch.no_grad()`` and forward functions say nothing."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import torchspmd
from torchspmd.step import NoAutogradWarning

DEV = torchspmd.device()


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoAutogradWarning)
        for _ in range(3):
            fn(*args)


def test_a_compiled_forward_whose_results_need_backward_says_so():
    model = torch.nn.Linear(4, 2).to(DEV)
    forward = torchspmd.compile(model)
    with pytest.warns(NoAutogradWarning, match=r"Linear returns tensors with autograd history.*"
                                               r"Compile the training step"):
        out = forward(torch.randn(3, 4).to(DEV))
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()


def test_a_training_step_says_nothing():
    model = torch.nn.Linear(4, 2).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torchspmd.compile
    def step(x):
        opt.zero_grad()
        loss = F.mse_loss(model(x), torch.zeros(3, 2, device=DEV))
        loss.backward()
        opt.step()
        return loss

    _quiet(step, torch.randn(3, 4).to(DEV))


def test_evaluation_under_no_grad_says_nothing():
    model = torch.nn.Linear(4, 2).to(DEV)

    @torchspmd.compile
    def evaluate(x):
        with torch.no_grad():
            return model(x).argmax(-1), model(x)

    _quiet(evaluate, torch.randn(3, 4).to(DEV))


def test_a_compiled_forward_function_says_nothing():
    model = torch.nn.Linear(4, 2).to(DEV)
    _quiet(torchspmd.compile(lambda x: model(x)), torch.randn(3, 4).to(DEV))
