"""Handle: the lazy state behind an spmd tensor, as the layers above device/ read it."""

import torch


def test_stored_node_of_a_view_is_its_bases_current_node():
    x = torch.ones(4, 2, device="spmd")
    view = x[0]
    x.add_(1)
    assert view.handle.stored_node() is x.handle.value()[0]
    assert view.handle.value()[0] is not x.handle.value()[0]  # the view derives its own
