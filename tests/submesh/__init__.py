"""Sub-meshes (seed 002, spec §4.7): meshes over any subset of the devices, in any order.

Helpers shared by the sub-mesh tests live here.
"""

from __future__ import annotations

import pytest
import torch

from torchspmd.lazy import handle


def devices_of(t: torch.Tensor) -> set[int]:
    """The ids of the devices that hold ``t``'s data (runs pending work first)."""
    node, i = t.handle.value()
    if not node.is_leaf or node.arrays is None:
        (t + 0).cpu()  # materializes t (and uploads a host leaf) without changing it
        node, i = t.handle.value()
    return {d.id for d in node.arrays[i].sharding.device_set}


@pytest.fixture(autouse=True)
def _no_pending_work_from_earlier_tests():
    """Start each test with nothing pending.

    A test that failed inside a computation keeps its tensors alive in its traceback;
    their pending work would otherwise join (and fail) the next test's ``sync()``.
    """
    for registry in (getattr(handle, "PENDING", None), getattr(handle, "PENDING_VIEWS", None)):
        if registry is not None:
            registry.clear()
    yield
