"""The sub-mesh seed's test matrix (seed 002; spec §4.7), on several sub-meshes.

Each case runs on the sub-meshes ``[0, 1]``, ``[2, 3]``, ``[4..7]`` (as ``(2, 2)`` and
``(1, 4)``) and ``[3, 1]`` (reversed), with tensors made two ways: a CPU tensor moved with
``.to(device)`` (expected value computed on CPU), and direct creation with ``device=``
(expected value from the device tensors' own ``.cpu()``, taken before the op). Results must
equal the CPU result and live on the sub-mesh's devices only.

Seven patterns (``.cpu()`` before or after ``sync()``; one or both operands sharded; an
in-place change before sharding)::

    1. shard both -> matmul -> .cpu() -> sync()
    2. shard both -> matmul -> sync() -> .cpu()
    3. shard one  -> matmul -> .cpu() -> sync()
    4. shard one  -> matmul -> sync() -> .cpu()
    5. modify -> shard one  -> matmul -> sync() -> .cpu()
    6. modify -> shard both -> matmul -> sync() -> .cpu()
    7. modify -> shard one  -> matmul -> .cpu() -> sync()
"""

from __future__ import annotations

import pytest
import torch

import torchspmd
from tests.submesh import _no_pending_work_from_earlier_tests, devices_of  # noqa: F401
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

# id -> (device ids, mesh shape); shapes small so every graph compiles in milliseconds.
SUB_MESHES = {
    "ids0-1": ([0, 1], (1, 2)),
    "ids2-3": ([2, 3], (1, 2)),
    "ids4-7_2x2": ([4, 5, 6, 7], (2, 2)),
    "ids4-7_1x4": ([4, 5, 6, 7], (1, 4)),
    "ids3-1_reversed": ([3, 1], (1, 2)),
}
SHAPE = (4, 4)
ATOL = 1e-5

# pattern -> (modify first, shard both operands, .cpu() before sync())
PATTERNS = {
    "p1_both_cpu_then_sync": (False, True, True),
    "p2_both_sync_then_cpu": (False, True, False),
    "p3_one_cpu_then_sync": (False, False, True),
    "p4_one_sync_then_cpu": (False, False, False),
    "p5_modify_one_sync_then_cpu": (True, False, False),
    "p6_modify_both_sync_then_cpu": (True, True, False),
    "p7_modify_one_cpu_then_sync": (True, False, True),
}


@pytest.fixture(params=list(SUB_MESHES), ids=list(SUB_MESHES))
def mesh(request) -> Mesh:
    ids, shape = SUB_MESHES[request.param]
    return Mesh(ids, shape, ("x", "y"))


@pytest.fixture(params=["to_device", "direct"])
def make(request):
    """``make(n) -> (device tensors, their CPU values)`` in one of the two ways."""
    def to_device(n):
        cpu = [torch.randn(SHAPE) for _ in range(n)]
        return [c.to("spmd") for c in cpu], cpu

    def direct(n):
        dev = [torch.randn(SHAPE, device="spmd") for _ in range(n)]
        return dev, [d.cpu() for d in dev]

    return {"to_device": to_device, "direct": direct}[request.param]


def _check(result: torch.Tensor, expected: torch.Tensor, cpu_first: bool, mesh: Mesh) -> None:
    if cpu_first:
        got = result.cpu()
        torchspmd.sync()
    else:
        torchspmd.sync()
        got = result.cpu()
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)
    assert devices_of(result) <= set(mesh.device_ids.tolist())


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_pattern(pattern, mesh, make):
    modify, both, cpu_first = PATTERNS[pattern]
    (xt1, xt2), (t1, t2) = make(2)
    expected = torch.matmul(t1 + 2 if modify else t1, t2)
    if modify:
        xt1 += 2
    mark_sharding(xt1, mesh, ("x", "y"))
    if both:
        mark_sharding(xt2, mesh, ("x", "y"))
    _check(torch.matmul(xt1, xt2), expected, cpu_first, mesh)


def test_single_tensor_addition(mesh, make):
    (xt,), (t,) = make(1)
    mark_sharding(xt, mesh, ("x", None))
    _check(xt + 4.2, t + 4.2, cpu_first=False, mesh=mesh)


def test_three_sharded_tensors(mesh, make):
    (xt1, xt2, xt3), (t1, t2, t3) = make(3)
    for xt in (xt1, xt2, xt3):
        mark_sharding(xt, mesh, ("x", "y"))
    _check(torch.matmul(xt1 + xt2, xt3), torch.matmul(t1 + t2, t3), cpu_first=False, mesh=mesh)


def test_inplace_ops(mesh, make):
    (xt1, xt2), (t1, t2) = make(2)
    mark_sharding(xt1, mesh, ("x", "y"))
    mark_sharding(xt2, mesh, ("x", "y"))
    spec = get_sharding(xt1)
    xt1 *= 2.0
    xt1 += xt2
    _check(xt1, t1 * 2.0 + t2, cpu_first=False, mesh=mesh)
    assert get_sharding(xt1) == spec  # in-place ops keep the target's sharding
