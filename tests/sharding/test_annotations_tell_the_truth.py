"""Annotations say what the user asked for, and nothing else (issue 9 §3).

``clear_sharding`` clears every annotation; ``copy_`` does not hand the source's
annotation to its target; where an unmarked result lives depends on its own computation,
not on what else is pending at the same ``sync()``; annotating a view (an ``expand``
included) annotates the view and writes nothing; writes through ``expand`` views work as
on CPU.
"""

from __future__ import annotations

import pytest
import torch

import torchspmd
from tests.submesh import devices_of
from torchspmd.sharding import (Mesh, annotate_custom_sharding, clear_sharding, get_sharding,
                                mark_sharding)

DEV = torchspmd.device()
MESH = Mesh(list(range(8)), (2, 4), ("x", "y"))
LEFT = Mesh([0, 1, 2, 3], (4,), ("x",))
RIGHT = Mesh([4, 5, 6, 7], (4,), ("x",))


def test_clear_after_mark_and_annotate_custom_clears_everything():
    x = torch.randn(8, 8).to(DEV)
    mark_sharding(x, MESH, ("x", "y"))
    annotate_custom_sharding(x, MESH, (None, "y"))
    clear_sharding(x)
    assert get_sharding(x) == ""
    mark_sharding(x, MESH, ("y", None))  # no "existing annotation" left to refuse it
    assert get_sharding(x) == "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"


def test_copy_does_not_give_the_target_the_sources_annotation():
    a = torch.zeros(8).to(DEV)
    b = torch.arange(8.).to(DEV)
    mark_sharding(b, LEFT, ("x",))
    a.copy_(b)
    assert get_sharding(a) == ""
    assert a.cpu().tolist() == list(range(8))


def test_copy_keeps_the_targets_own_annotation():
    a = torch.zeros(8, 8).to(DEV)
    mark_sharding(a, MESH, ("x", None))
    b = torch.arange(64.).reshape(8, 8).to(DEV) * 1
    mark_sharding(b, MESH, (None, "y"))
    a.copy_(b)
    text = "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert get_sharding(a) == text
    torchspmd.sync()
    assert get_sharding(a) == text
    torch.testing.assert_close(a.cpu(), torch.arange(64.).reshape(8, 8))


def test_an_unmarked_result_lives_where_its_own_computation_runs():
    left = torch.arange(8.).to(DEV)
    mark_sharding(left, LEFT, ("x",))
    on_left = left * 2
    unmarked = torch.ones(8).to(DEV) + 1  # computed beside sub-mesh work
    torchspmd.sync()
    assert devices_of(on_left) == {0, 1, 2, 3}
    assert devices_of(unmarked) == set(range(8))
    right = torch.arange(8.).to(DEV)
    mark_sharding(right, RIGHT, ("x",))
    torch.testing.assert_close((right * unmarked).cpu(), torch.arange(8.) * 2)


def test_independent_work_on_one_mesh_is_one_program():
    x = torch.randn(8, 8).to(DEV)
    mark_sharding(x, MESH, ("x", None))
    torchspmd.sync()
    before = torchspmd.metrics()["executions"]
    _a, _b, c = x * 2, x.sum(), torch.ones(3).to(DEV) + 1  # three independent computations
    torchspmd.sync()
    assert torchspmd.metrics()["executions"] == before + 1
    assert c.cpu().tolist() == [2.0, 2.0, 2.0]


EXPANDED_TEXT = {
    "mark": "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
    "annotate": "{devices=[2,4]0,1,2,3,4,5,6,7}",
    "clear": "",
}


@pytest.mark.parametrize("call", list(EXPANDED_TEXT))
def test_annotating_an_expanded_view_writes_nothing(call):
    base = torch.arange(4.).to(DEV)
    view = base.expand(8, 4)
    if call == "annotate":
        annotate_custom_sharding(view, MESH, ("x", "y"))
    else:
        mark_sharding(view, MESH, ("x", None))
    if call == "clear":
        clear_sharding(view)
    assert get_sharding(view) == EXPANDED_TEXT[call]
    assert get_sharding(base) == ""
    torch.testing.assert_close(view.cpu(), torch.arange(4.).expand(8, 4))


def test_view_keeps_its_annotation_when_its_base_changes():
    base = torch.arange(6., device=DEV)
    view = base.reshape(3, 2)
    mark_sharding(view, Mesh([0, 1, 2], (3,)), (0, None))
    base.add_(1)
    assert get_sharding(view) == "{devices=[3,1]0,1,2}"
    assert view.cpu().tolist() == [[1, 2], [3, 4], [5, 6]]


def test_writing_a_row_of_an_expanded_view_writes_the_base_as_on_cpu():
    results = []
    for device in ("cpu", DEV):
        x = torch.arange(4.).to(device)
        expanded = x.expand(2, 4)
        expanded[0].add_(1)
        results.append((x.cpu(), expanded.cpu()))
    torch.testing.assert_close(results[1], results[0])


def test_writing_a_transposed_expanded_view_matches_cpu():
    results = []
    for device in ("cpu", DEV):
        y = torch.arange(6.).to(device).reshape(2, 3)
        y.t().unsqueeze(0).expand(3, 3, 2)[1][:, 1].mul_(10)
        results.append(y.cpu())
    torch.testing.assert_close(results[1], results[0])


def test_writing_a_view_whose_elements_share_memory_raises_pytorchs_error():
    x = torch.arange(4.).to(DEV)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        x.expand(2, 4).add_(1)
    assert x.cpu().tolist() == [0, 1, 2, 3]
