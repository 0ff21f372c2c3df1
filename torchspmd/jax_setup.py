"""JAX configuration that must happen before JAX's backend starts.

Imported first by ``torchspmd/__init__.py``. On a host with no accelerator JAX gets
``TORCHSPMD_CPU_DEVICES`` CPU devices per process (default 8 per host, split between the
processes torchrun starts on it), so meshes of 8 work everywhere. x64 is on so
int64/float64 tensors keep their dtype. ``TORCHSPMD_COMPILATION_CACHE=DIR`` keeps
compiled programs on disk across runs.

Under torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set, more
than one process) this also starts JAX's multi-process runtime, before anything can
start JAX's backend as a single process.
"""

import functools
import os

import jax

from torchspmd.lowering import jax_private
from torchspmd.runtime import environment, launch, processes

DEFAULT_CPU_DEVICES = 8


def _configure() -> None:
    jax.config.update("jax_enable_x64", True)
    found = launch.from_environment()  # a half-set torchrun environment raises here
    per_host = found.local_world_size if found is not None else 1
    asked = environment.positive_int("TORCHSPMD_CPU_DEVICES", "the number of CPU devices JAX "
                                     "starts in this process", DEFAULT_CPU_DEVICES)
    if not _set_cpu_devices(asked or max(1, DEFAULT_CPU_DEVICES // per_host)):
        _check_started_devices(asked, found)
    cache = os.environ.get("TORCHSPMD_COMPILATION_CACHE")
    if cache:  # XLA compiles dominate start-up; a disk cache makes re-runs start warm
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if found is not None and found.is_multi_process and not processes.is_started():
        processes.start(found.coordinator_address, found.num_processes, found.process_id)


def _set_cpu_devices(count: int) -> bool:
    """Give JAX ``count`` CPU devices; False if its backend already started (too late)."""
    if jax_private.backends_started():
        return False
    try:  # must precede the first backend use; harmless when an accelerator is the default
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # started after all (the check above fell back to "not started")
        return False
    return True


def _check_started_devices(asked: int | None, found: launch.Launch | None) -> None:
    """JAX ran before torchspmd was imported: its devices are fixed. Go on with them
    unless the environment asks for what they can no longer become."""
    first = ("import torchspmd before the program's first JAX operation (JAX fixes its "
             "devices when it first runs)")
    if found is not None and found.is_multi_process and not processes.is_started():
        raise RuntimeError(
            f"torchspmd: this process is one of {found.num_processes} that torchrun "
            "started, but JAX's devices were already in use in it as a single process: "
            f"{first}.")
    running = len(jax.devices("cpu"))
    if asked is not None and asked != running:
        raise RuntimeError(
            f"torchspmd: TORCHSPMD_CPU_DEVICES={asked} asks for {asked} CPU devices, but "
            f"JAX already started with {running}: {first}, or leave "
            "TORCHSPMD_CPU_DEVICES unset to use the devices JAX has.")


_configure()


def devices() -> list:
    """Every process's devices, in global order: global device id ``i`` is ``devices()[i]``.

    In one process the ids are JAX's device ids; with several processes JAX's own ids
    need not be contiguous (CPU devices of process 1 start at 2048), so torchspmd numbers
    the devices by their position here, as PyTorch/XLA's global ordinals.
    """
    return jax.devices()


def device_id(device) -> int:
    """The global id of JAX device ``device`` (its position in :func:`devices`).

    >>> device_id(devices()[3])
    3
    """
    return _ids()[device]


@functools.cache
def _ids() -> dict:
    # Cached once the backend runs; the device list never changes afterwards.
    return {d: i for i, d in enumerate(jax.devices())}
