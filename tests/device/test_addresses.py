"""``data_ptr()`` and ``storage_offset()`` of spmd tensors answer as CPU tensors' do.

The data lives on the devices, so the numbers are addresses in a host-side space of their
own, but code that finds tied weights or shared memory by comparing them (``a.data_ptr()
== b.data_ptr()``, ranges of ``[data_ptr, data_ptr + nbytes)``) gets CPU's answers: the
same number for tensors over the same data, different numbers (and disjoint ranges)
otherwise, and a view's offset where CPU has it.
"""

import pytest
import torch

from tests.step.helpers import DEVICE

VIEWS = {
    "slice": lambda t: t[1:],
    "row": lambda t: t[2],
    "column": lambda t: t[:, 3],
    "transpose": lambda t: t.t(),
    "narrow": lambda t: t.narrow(1, 2, 2),
    "diagonal": lambda t: t.diagonal(1),
    "unfold": lambda t: t.unfold(1, 2, 1)[1],
    "as_strided": lambda t: t.as_strided((2, 2), (5, 1), 7),
    "view of a slice": lambda t: t[1:3].reshape(-1)[4:],
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_a_views_offset_is_cpus(view):
    base = torch.arange(20.0).reshape(4, 5)
    on_device = base.to(DEVICE)
    cpu_view, device_view = VIEWS[view](base), VIEWS[view](on_device)
    assert device_view.storage_offset() == cpu_view.storage_offset()
    assert (device_view.data_ptr() - on_device.data_ptr()
            == cpu_view.data_ptr() - base.data_ptr())


def test_tensors_over_the_same_data_have_one_address():
    p = torch.nn.Parameter(torch.ones(3, device=DEVICE))
    assert p.data_ptr() == p.data.data_ptr() == p.detach().data_ptr() == p.view(3).data_ptr()


def test_distinct_tensors_have_distinct_addresses_and_disjoint_ranges():
    tensors = [torch.ones(n, device=DEVICE) for n in (1, 100, 7, 1000)]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in tensors)
    assert all(0 < end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


def test_tied_weights_are_found_by_address():
    embed, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    other = torch.nn.Linear(4, 10, bias=False)
    model = torch.nn.ModuleList([embed, head, other]).to(DEVICE)
    assert model[0].weight.data_ptr() == model[1].weight.data_ptr()
    assert model[2].weight.data_ptr() != model[0].weight.data_ptr()


def test_a_storage_keeps_its_address_across_writes():
    t = torch.zeros(4, device=DEVICE)
    before = t.data_ptr()
    t.add_(1)
    t[1:].mul_(2)
    assert t.data_ptr() == before == t.untyped_storage().data_ptr()
