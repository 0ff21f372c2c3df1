"""The spmd device behaves like any PyTorch device."""

import copy
import io

import pytest
import torch

import torchspmd


def test_device_is_one_virtual_device():
    assert torchspmd.device() == torch.device("spmd", 0)
    assert torch.device("spmd").type == "spmd"


def test_device_count_is_the_physical_devices():
    import jax

    assert torchspmd.device_count() == len(jax.devices())  # 8 CPU devices here, 1 GPU there


def test_to_device_and_back_round_trips():
    x = torch.randn(3, 4)
    y = x.to(torchspmd.device())
    assert y.device == torch.device("spmd", 0)
    assert torch.equal(y.cpu(), x)
    assert torch.equal(y.to("cpu"), x)


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(2, 3, device=d),
    lambda d: torch.full((2, 3), 7.5, device=d),
    lambda d: torch.arange(10, device=d),
    lambda d: torch.arange(1, 4, 0.5, device=d),
    lambda d: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=d),
    lambda d: torch.eye(3, device=d),
    lambda d: torch.empty(2, 3, device=d).shape,
])
def test_factory_functions_match_cpu(make):
    spmd, cpu = make("spmd"), make("cpu")
    if isinstance(cpu, torch.Size):
        assert spmd == cpu
        return
    assert spmd.device.type == "spmd" and spmd.dtype == cpu.dtype
    assert torch.equal(spmd.cpu(), cpu)


def test_item_and_tolist():
    x = torch.tensor([1.5, 2.5], device="spmd")
    assert x.sum().item() == 4.0
    assert x.tolist() == [1.5, 2.5]


def test_bool_of_a_one_element_tensor_runs_it():
    assert bool(torch.tensor([3.0], device="spmd") > 2)


def test_print_shows_values_and_device():
    text = repr(torch.tensor([1.0, 2.0], device="spmd"))
    assert text == "tensor([1., 2.], device='spmd:0')"


def test_clone_is_independent():
    x = torch.ones(3, device="spmd")
    y = x.clone()
    y.add_(1)
    assert torch.equal(x.cpu(), torch.ones(3))
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_deepcopy_copies_values():
    x = torch.arange(4.0, device="spmd")
    y = copy.deepcopy(x)
    x.mul_(0)
    assert torch.equal(y.cpu(), torch.arange(4.0))


def test_torch_save_stores_a_cpu_copy():
    buffer = io.BytesIO()
    torch.save(torch.arange(3.0, device="spmd"), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.device.type == "cpu"
    assert torch.equal(loaded, torch.arange(3.0))


def test_torch_load_onto_the_device_says_to_load_to_the_cpu_first():
    buffer = io.BytesIO()
    torch.save(torch.arange(3.0, device="spmd"), buffer)
    for where in ("spmd", torch.device("spmd", 0)):
        buffer.seek(0)
        with pytest.raises(RuntimeError, match=r"torch.load cannot map storages to the spmd "
                                               r"device.*map_location='cpu'.*\.to\('spmd'\)"):
            torch.load(buffer, map_location=where)


def test_numpy_raises_like_cuda():
    with pytest.raises(TypeError, match="can't convert spmd:0 device type tensor to numpy"):
        torch.ones(2, device="spmd").numpy()


def test_unsupported_op_names_itself():
    with pytest.raises(NotImplementedError, match="torchspmd: aten::quantize_per_tensor"):
        torch.quantize_per_tensor(torch.ones(2, device="spmd"), 0.1, 0, torch.quint8)


def test_model_to_device():
    model = torch.nn.Linear(4, 2)
    expected = model(torch.ones(1, 4))
    model.to(torchspmd.device())
    assert model.weight.device.type == "spmd"
    assert isinstance(model.weight, torch.nn.Parameter)
    torch.testing.assert_close(model(torch.ones(1, 4, device="spmd")).cpu(), expected)


def test_device_memory_is_not_pinned_host_memory():
    """``is_pinned()`` is False, as for CUDA tensors (torch.distributed.checkpoint's default
    planner asks it of every tensor it saves)."""
    assert torch.ones(2, device="spmd").is_pinned() is False
