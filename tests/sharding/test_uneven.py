"""Uneven shardings (docs/concepts/rules.md): kept as the tensor's annotation, replicated for XLA.

XLA's partitioner miscompiles a dynamic-update-slice under a constraint whose dim its
mesh axes do not divide (issue 9 §1). Every route by which an uneven annotation could
reach XLA is checked here against CPU PyTorch: marks of pending values, host and device
data, ``annotate_custom_sharding``, in-place ops that re-apply an annotation, other
values of the same ``sync()``, and several uneven marks at once.
"""

from __future__ import annotations

import pytest
import torch

import torchspmd
from torchspmd.sharding import (Mesh, XLAShard, annotate_custom_sharding, get_sharding,
                                mark_sharding)

DEV = torchspmd.device()
TWO = Mesh([0, 1], (2,))
THREE = Mesh([0, 1, 2], (3,))
EIGHT = Mesh(list(range(8)), (8,))


def test_row_write_into_three_rows_marked_over_two_devices_matches_cpu():
    x = torch.arange(6., device=DEV).reshape(3, 2)
    mark_sharding(x, TWO, (0, None))
    x[0] = 7.0
    assert x.cpu().tolist() == [[7, 7], [2, 3], [4, 5]]


def test_column_write_then_uneven_mark_over_three_devices_matches_cpu():
    cpu = torch.arange(12).reshape(3, 4)
    x = cpu.to(DEV)
    x[:, -2] = -1
    cpu[:, -2] = -1
    mark_sharding(x, THREE, (None, 0))
    torch.testing.assert_close(x.cpu(), cpu)


def test_uneven_annotation_is_what_sharding_spec_and_local_shards_show():
    x = torch.arange(6., device=DEV).reshape(3, 2) * 1
    xst = mark_sharding(x, TWO, (0, None))
    x[0] = 7.0
    assert get_sharding(x) == "{devices=[2,1]0,1}" == xst.sharding_spec
    shards = xst.local_shards
    assert [s.indices for s in shards] == [[slice(0, 2, 1), slice(0, 2, 1)], [slice(2, 3, 1), slice(0, 2, 1)]]
    assert shards[1].data.tolist() == [[4, 5], [0, 0]]  # zero-padded, as PyTorch/XLA


def test_another_value_of_the_same_sync_matches_cpu():
    x = torch.arange(6., device=DEV).reshape(3, 2) * 1
    mark_sharding(x, TWO, (0, None))
    y = torch.arange(6., device=DEV).reshape(3, 2)
    y[0] = 7.0
    z = x * y
    torchspmd.sync()
    assert z.cpu().tolist() == [[0, 7], [4, 9], [16, 25]]


def test_in_place_op_reapplying_an_uneven_annotation_then_a_slice_write_matches_cpu():
    x = torch.arange(6., device=DEV).reshape(3, 2)
    mark_sharding(x, TWO, (0, None))
    x.mul_(torch.full((3, 2), 2., device=DEV))
    x[0] = 7.0
    assert x.cpu().tolist() == [[7, 7], [4, 6], [8, 10]]
    assert get_sharding(x) == "{devices=[2,1]0,1}"


@pytest.mark.parametrize("data", ["pending", "device"])
def test_annotate_custom_sharding_uneven_then_a_row_write_matches_cpu(data):
    x = torch.arange(6., device=DEV).reshape(3, 2) * (1 if data == "pending" else 2)
    if data == "device":
        torchspmd.sync()
    annotate_custom_sharding(x, TWO, (0, None))
    x[0] = 7.0
    expected = torch.arange(6.).reshape(3, 2) * (1 if data == "pending" else 2)
    expected[0] = 7.0
    torch.testing.assert_close(x.cpu(), expected)


def test_one_element_strided_slice_marked_eight_ways_matches_cpu():
    cpu = torch.randn(13)
    x = (cpu.to(DEV) * 1)[9:10:3]
    mark_sharding(x, EIGHT, (0,))
    torch.testing.assert_close(x.cpu(), cpu[9:10:3])


def test_two_uneven_marks_in_one_sync_match_cpu():
    a = torch.arange(3., device=DEV) * 1
    b = torch.arange(15., device=DEV).reshape(5, 3) * 1
    mark_sharding(a, EIGHT, (0,))
    mark_sharding(b, EIGHT, (0, None))
    c = b @ a
    b[1] = 0.0
    torchspmd.sync()
    expected_b = torch.arange(15.).reshape(5, 3)
    torch.testing.assert_close(c.cpu(), expected_b @ torch.arange(3.))
    expected_b[1] = 0.0
    torch.testing.assert_close(b.cpu(), expected_b)


def test_uneven_host_and_device_data_keep_values_and_annotation():
    host = torch.arange(9.)
    x = host.to(DEV)
    mark_sharding(x, EIGHT, (0,))
    y = (host.to(DEV) * 1)
    torchspmd.sync()
    mark_sharding(y, EIGHT, (0,))
    x[8] = -1.0
    y[8] = -1.0
    host[8] = -1.0
    torch.testing.assert_close(x.cpu(), host)
    torch.testing.assert_close(y.cpu(), host)
    assert get_sharding(x) == get_sharding(y) == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_load_local_shards_of_an_uneven_tensor_round_trips():
    x = torch.arange(9., device=DEV) * 1
    xst = mark_sharding(x, EIGHT, (0,))
    shards = [XLAShard(s.data * 2, s.indices, s.shard_device, s.replica_id)
              for s in xst.local_shards]
    xst.load_local_shards_(shards)
    x[0] = 5.0
    assert x.cpu().tolist() == [5.0] + [2.0 * i for i in range(1, 9)]
