"""``torch.distributions`` on the device: they check their arguments with
``torch._is_all_true`` (``validate_args``), which had no lowering."""

import torch

import torchspmd

DEV = torchspmd.device()


def test_normal_and_categorical_match_cpu():
    def values(dev):
        normal = torch.distributions.Normal(torch.zeros(3, device=dev), torch.full((3,), 2.0, device=dev))
        categorical = torch.distributions.Categorical(logits=torch.tensor([0.1, 0.5, 2.0], device=dev))
        return (normal.log_prob(torch.tensor([0.5, 1.0, -1.0], device=dev)), normal.entropy(),
                categorical.log_prob(torch.tensor(2, device=dev)), categorical.probs)

    for got, want in zip(values(DEV), values("cpu")):
        torch.testing.assert_close(got.cpu(), want)


def test_an_invalid_argument_is_refused_as_on_cpu():
    scale = torch.tensor([1.0, -1.0], device=DEV)
    try:
        # Explicitly: torch._dynamo, once set up in a process, turns the default off.
        torch.distributions.Normal(torch.zeros(2, device=DEV), scale, validate_args=True)
    except ValueError as error:
        assert "scale" in str(error)
    else:
        raise AssertionError("a negative scale was accepted")
    assert not bool(torch._is_all_true(scale > 0)) and bool(torch._is_any_true(scale > 0))
