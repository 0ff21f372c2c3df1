"""JAX configuration that must happen before JAX's backend starts.

Imported first by ``torchspmd/__init__.py``. On a host with no accelerator JAX gets
``TORCHSPMD_CPU_DEVICES`` CPU devices (default 8), so meshes of 8 work everywhere.
x64 is on so int64/float64 tensors keep their dtype. ``TORCHSPMD_COMPILATION_CACHE=DIR``
keeps compiled programs on disk across runs.
"""

import os

import jax

DEFAULT_CPU_DEVICES = 8


def _configure() -> None:
    jax.config.update("jax_enable_x64", True)
    count = int(os.environ.get("TORCHSPMD_CPU_DEVICES", DEFAULT_CPU_DEVICES))
    # Must precede the first backend use; harmless when an accelerator is the default.
    jax.config.update("jax_num_cpu_devices", count)
    cache = os.environ.get("TORCHSPMD_COMPILATION_CACHE")
    if cache:  # XLA compiles dominate start-up; a disk cache makes re-runs start warm
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


_configure()


def devices() -> list:
    """The physical devices torchspmd runs on, in id order (id i is ``devices()[i]``)."""
    return jax.devices()
