"""``nn.TransformerEncoder`` in eval with a padding mask runs on the padded batch.

PyTorch's fast path turns the batch into a nested tensor on its own devices; the spmd
device has no nested tensors, so the encoder runs its layers on the padded batch (as on
PyTorch/XLA's device): CPU's values at the real positions, and at the padded positions
the values of PyTorch's path without nested tensors.
"""

import copy

import torch

from tests.step.helpers import DEVICE

MASK = torch.tensor([[False, False, False, True, True], [False, False, False, False, False]])


def encoder(nested: bool = True) -> torch.nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()


def run(model, x, mask):
    with torch.no_grad():
        return model(x, src_key_padding_mask=mask)


def test_real_positions_match_cpus_nested_path():
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    cpu = encoder()
    got = run(copy.deepcopy(cpu).to(DEVICE), x.to(DEVICE), MASK.to(DEVICE)).cpu()
    torch.testing.assert_close(got[~MASK], run(cpu, x, MASK)[~MASK])


def test_padded_positions_match_cpus_path_without_nested_tensors():
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    got = run(encoder().to(DEVICE), x.to(DEVICE), MASK.to(DEVICE)).cpu()
    torch.testing.assert_close(got, run(encoder(nested=False), x, MASK))
