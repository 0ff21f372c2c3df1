"""debug.tensor_debug_info: PyTorch/XLA's ``_get_xla_tensor_debug_info`` lines mean the same."""

import numpy as np
import torch

import torchspmd
from torchspmd.debug import _get_xla_tensor_debug_info, tensor_debug_info
from torchspmd.sharding import Mesh, mark_sharding

DEV = torchspmd.device()
MESH = Mesh(np.arange(8), (8,), ("x",))


def test_cpu_data_not_yet_uploaded():
    # PyTorch/XLA test_virtual_device_no_upload: the upload is deferred.
    info = tensor_debug_info(torch.randn(5, 5).to(DEV))
    for line in ("Tensor on host: with size [5, 5]", "Device: SPMD:0", "IR: None",
                 "XLAData: None", "XLA Shape: f32[5,5]", "ShardingSpec: None"):
        assert line in info, line


def test_a_pending_value_names_its_op_and_graph_size():
    x = torch.ones(4, 2).to(DEV)
    info = tensor_debug_info((x * 2).sum(dim=0))
    assert "IR: [] aten::sum.dim_IntList, xla_shape=f32[2], output=0, pending_nodes=2" in info
    assert "XLAData: None" in info and "Tensor on host: None" in info


def test_after_sync_the_value_is_data_not_the_op():
    # PyTorch/XLA test_sync_on_virtual_device: 'aten::div' is gone after the sync.
    y = torch.randn(3, 3).to(DEV) / 0.5
    assert "aten::div" in tensor_debug_info(y)
    torchspmd.sync()
    info = tensor_debug_info(y)
    assert "aten::div" not in info and "IR: None" in info and "XLAData: \n" in info


def test_sharded_device_data_shows_its_spec_and_shards():
    x = torch.randn(16, 4).to(DEV)
    mark_sharding(x, MESH, ("x", None))
    (x + 0).cpu()  # uploads x
    info = tensor_debug_info(x)
    spec = "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert f"ShardingSpec: {spec}" in info
    assert f"XLAShardedData: \n  Data Device: SPMD:0\n  Data Shape: f32[16,4]\n  OpSharding: {spec}\n  NumShards: 8\n" in info


def test_marked_cpu_data_is_still_on_the_host_with_its_spec():
    x = torch.randn(16, 4).to(DEV)
    mark_sharding(x, MESH, ("x", None))
    info = tensor_debug_info(x)
    assert "Tensor on host: with size [16, 4]" in info
    assert "ShardingSpec: {devices=[8,1]0,1,2,3,4,5,6,7}" in info


def test_pytorch_xla_name_is_the_same_function():
    assert _get_xla_tensor_debug_info is tensor_debug_info
