"""Importing torchspmd into a program that already ran JAX.

JAX fixes its devices when it first runs, so torchspmd, imported after that, goes on with
the devices JAX has; it refuses only what can no longer be given: another CPU device
count, or a multi-process launch. A bad ``TORCHSPMD_CPU_DEVICES`` is named, whenever the
import happens. Each case runs in a fresh interpreter (the import configures JAX once per
process).
"""

import os
import subprocess
import sys

import pytest

from torchspmd.runtime.environment import positive_int

JAX_FIRST = """
import jax, jax.numpy as jnp
x = jnp.arange(4.0) * 2          # JAX starts its devices here
import torch, torchspmd
t = torch.arange(4.0, device="spmd") * 2
assert t.cpu().tolist() == x.tolist() == [0.0, 2.0, 4.0, 6.0]
print("devices", len(jax.devices()))
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TORCHSPMD_CPU_DEVICES", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                            "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return subprocess.run([sys.executable, "-c", code], env={**environ, **env},
                          capture_output=True, text=True, timeout=300)


def test_a_program_that_ran_jax_first_keeps_jax_devices_and_computes():
    done = run(JAX_FIRST)
    assert done.returncode == 0, done.stderr
    assert "devices 1" in done.stdout


def test_the_count_jax_already_has_is_accepted():
    done = run(JAX_FIRST, TORCHSPMD_CPU_DEVICES="1")
    assert done.returncode == 0, done.stderr


def test_another_count_after_jax_started_says_to_import_torchspmd_first():
    done = run(JAX_FIRST, TORCHSPMD_CPU_DEVICES="4")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: torchspmd: TORCHSPMD_CPU_DEVICES=4 asks for 4")
    assert "import torchspmd before the program's first JAX operation" in last


def test_a_torchrun_launch_after_jax_started_says_to_import_torchspmd_first():
    done = run(JAX_FIRST, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29911")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: torchspmd: this process is one of 2")
    assert "import torchspmd before the program's first JAX operation" in last


def cpu_devices(text: str | None) -> int | None:
    environ = {} if text is None else {"TORCHSPMD_CPU_DEVICES": text}
    return positive_int("TORCHSPMD_CPU_DEVICES", "the number of CPU devices", 8, environ)


@pytest.mark.parametrize("text", ["four", "0", "-2", "1.5"])
def test_a_device_count_that_is_no_positive_integer_is_named(text):
    with pytest.raises(ValueError, match=f"TORCHSPMD_CPU_DEVICES='{text}' must be an int >= 1"):
        cpu_devices(text)


@pytest.mark.parametrize("text, count", [(None, None), ("", None), ("8", 8), (" 2 ", 2)])
def test_an_unset_or_integer_device_count_is_read(text, count):
    assert cpu_devices(text) == count
