"""Reading torchrun's environment, and starting the runtime at the wrong moment."""

import pytest

import torchspmd.distributed
import torchspmd.runtime as xr
from torchspmd.runtime.launch import Launch, LaunchError, from_environment

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_no_launcher_variables_mean_one_process():
    assert from_environment({"PATH": "/bin"}) is None


def test_torchrun_environment_puts_jax_coordinator_on_the_next_port():
    assert from_environment(TORCHRUN) == Launch("10.0.0.1:29501", num_processes=4, process_id=1,
                                                local_rank=1, local_world_size=2)


def test_jax_coordinator_address_overrides_the_port_rule():
    env = {**TORCHRUN, "JAX_COORDINATOR_ADDRESS": "10.0.0.9:7000"}
    assert from_environment(env).coordinator_address == "10.0.0.9:7000"


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_a_half_set_environment_names_what_is_missing(missing):
    env = {k: v for k, v in TORCHRUN.items() if k != missing}
    with pytest.raises(LaunchError, match=f"but not {missing}. A multi-process launch needs all"):
        from_environment(env)


@pytest.mark.parametrize("change, message", [
    ({"RANK": "4"}, r"RANK=4 must be in \[0, WORLD_SIZE=4\)"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 must be in \[0, LOCAL_WORLD_SIZE=2\)"),
    ({"MASTER_PORT": "65535"}, "leaves no room for JAX's coordinator"),
])
def test_inconsistent_values_are_refused(change, message):
    with pytest.raises(LaunchError, match=message):
        from_environment({**TORCHRUN, **change})


def test_initialize_after_devices_were_used_is_a_clear_error():
    xr.global_runtime_device_count()  # the backend is running (as one process)
    with pytest.raises(RuntimeError, match="must start before JAX's devices are used"):
        torchspmd.distributed.initialize("127.0.0.1:1", num_processes=2, process_id=0)
    assert not torchspmd.distributed.is_initialized()


def test_one_process_queries_match_pytorch_xla_spmd():
    assert (xr.process_index(), xr.process_count(), xr.world_size(), xr.global_ordinal(),
            xr.local_ordinal(), xr.local_device_count(), xr.is_master_ordinal(False)) == (
            0, 1, 1, 0, 0, 1, True)
    assert xr.global_runtime_device_count() == xr.addressable_runtime_device_count() == 8
