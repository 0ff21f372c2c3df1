"""The processes of one SPMD program: starting JAX's multi-controller runtime, and queries.

Every process runs the same program: the same graphs in the same order. Each drives its
own (addressable) devices; a computation over a mesh that spans several processes is one
XLA program that every process launches, and its collectives cross processes (gloo on
CPU). ``jax.distributed`` does the work: its coordinator (on process 0) lets processes
find each other and watches their heartbeats.

Who starts what:

- JAX's runtime: :func:`start`, called at ``import torchspmd`` under torchrun, or by
  ``torchspmd.distributed.initialize``. It must run before JAX's backend starts.
- ``torch.distributed`` (a gloo group, which ``torch.distributed.checkpoint`` uses to
  agree on a plan): :func:`init_torch_distributed`, called by the checkpoint planners
  when there is more than one process and nothing initialized it yet.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence

import jax

from torchspmd.lowering import jax_private
from torchspmd.runtime import launch as launch_env

__all__ = [
    "start", "is_started", "init_torch_distributed", "process_index", "process_count",
    "local_process_count", "global_runtime_device_count", "addressable_runtime_device_count",
    "local_device_count", "world_size", "global_ordinal", "local_ordinal", "is_master_ordinal",
]

DEFAULT_HEARTBEAT_TIMEOUT_S = 100  # JAX's default: a silent process is declared dead after this


def start(coordinator_address: str | None = None, num_processes: int | None = None,
          process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
          heartbeat_timeout_s: int | None = None) -> None:
    """Join the multi-process runtime (``jax.distributed.initialize``), with gloo on CPU.

    Arguments left ``None`` are found by JAX's cluster detection (Slurm, Open MPI, TPU
    pods). Raises ``RuntimeError`` if JAX's backend already started as one process.

    >>> start("10.0.0.1:29501", num_processes=2, process_id=0)  # doctest: +SKIP
    """
    if jax_private.backends_started():
        raise RuntimeError(
            "torchspmd: the multi-process runtime must start before JAX's devices are used. "
            "Call torchspmd.distributed.initialize(...) right after `import torchspmd`, "
            "before any tensor is moved to the spmd device or any device is queried.")
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = int(os.environ.get("TORCHSPMD_HEARTBEAT_TIMEOUT",
                                                 DEFAULT_HEARTBEAT_TIMEOUT_S))
    # Collectives between CPU devices of different processes go through gloo (no-op elsewhere).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator_address, num_processes=num_processes,
            process_id=process_id,
            local_device_ids=list(local_device_ids) if local_device_ids is not None else None,
            heartbeat_timeout_seconds=heartbeat_timeout_s)
    except ValueError as error:  # JAX found no cluster and was given too little
        raise RuntimeError(
            f"torchspmd: cannot start the multi-process runtime ({error}). Launch with "
            "torchrun, run under Slurm or mpirun, or pass coordinator_address, "
            "num_processes and process_id to torchspmd.distributed.initialize.") from None
    if jax.distributed.is_initialized() and jax_private.distributed_arguments().num_processes > 1:
        _exit_on_uncaught_exception()


def is_started() -> bool:
    """Whether this process joined a multi-process runtime."""
    return jax.distributed.is_initialized()


def started_as() -> tuple[str, int, int] | None:
    """(coordinator address, process count, process id) of the runtime joined, or ``None``."""
    if not is_started():
        return None
    state = jax_private.distributed_arguments()
    return state.coordinator_address, state.num_processes, state.process_id


def _exit_on_uncaught_exception() -> None:
    """After an uncaught exception, this process ends without JAX's shutdown barrier.

    Otherwise it would wait there (up to 5 minutes) while the others wait for it in a
    collective. Exiting at once stops its heartbeats and closes its connections, so the
    others fail fast, and torchrun tears them down as soon as it sees this one exit.
    The exception is only noted in ``sys.excepthook`` (other hooks, like
    torch.distributed's, wrap it and print the traceback); the exit happens at
    interpreter exit, before JAX's own exit handler (which holds the barrier) runs.
    """
    previous = sys.excepthook
    failed = []

    def note_failure(kind, value, traceback):
        failed.append(kind)
        previous(kind, value, traceback)

    def exit_now_if_failed():
        if failed:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    sys.excepthook = note_failure
    # atexit runs handlers last in, first out: this one before JAX's (registered at import).
    atexit.register(exit_now_if_failed)


def init_torch_distributed() -> None:
    """Start ``torch.distributed``'s gloo group over the processes, if not started yet.

    Under torchrun it uses torchrun's store (``env://``, ``MASTER_ADDR:MASTER_PORT``);
    otherwise a store on the coordinator's host at the coordinator's port + 1. A no-op in
    one process. Every process must call it (it waits for all of them).

    >>> init_torch_distributed()  # doctest: +SKIP
    """
    import torch.distributed as dist

    if process_count() == 1 or dist.is_initialized():
        return
    if launch_env.from_environment() is not None:
        init_method = "env://"
    else:
        address = jax_private.distributed_arguments().coordinator_address
        if address is None:
            raise RuntimeError(
                "torchspmd: cannot find the multi-process runtime's coordinator address to "
                "start torch.distributed beside it; launch with torchrun, or set "
                "JAX_COORDINATOR_ADDRESS.")
        host, port = address.rsplit(":", 1)
        init_method = f"tcp://{host}:{int(port) + 1}"
    dist.init_process_group("gloo", init_method=init_method, rank=process_index(),
                            world_size=process_count())


# --- PyTorch/XLA's runtime queries (torch_xla.runtime), with their SPMD values ----------
#
# Under SPMD each process sees one virtual device (``spmd:0``), so the per-device
# "ordinals" of PyTorch/XLA's multi-process mode collapse: world_size() is 1 and
# global_ordinal() is 0 in every process, as in PyTorch/XLA with use_spmd(). Use
# process_index()/process_count() to tell processes apart.


def process_index() -> int:
    """This process's index in ``[0, process_count())``.

    >>> process_index()
    0
    """
    return jax.process_index()


def process_count() -> int:
    """How many processes run the program.

    >>> process_count()
    1
    """
    return jax.process_count()


def local_process_count() -> int:
    """How many processes run on this host (torchrun's ``LOCAL_WORLD_SIZE``, else 1).

    >>> local_process_count()
    1
    """
    found = launch_env.from_environment()
    return found.local_world_size if found is not None else 1


def global_runtime_device_count() -> int:
    """Physical devices over all processes (the devices a ``Mesh`` may name).

    >>> global_runtime_device_count()
    8
    """
    return len(jax.devices())


def addressable_runtime_device_count() -> int:
    """Physical devices this process drives.

    >>> addressable_runtime_device_count()
    8
    """
    return len(jax.local_devices())


def local_device_count() -> int:
    """PyTorch/XLA's ``local_process_count() * addressable_device_count()``.

    Under SPMD a process addresses one (virtual) device, so this is the number of
    processes on this host; for physical devices use ``addressable_runtime_device_count``.

    >>> local_device_count()
    1
    """
    return local_process_count()


def world_size() -> int:
    """1: under SPMD the program has one logical device (as in PyTorch/XLA).

    >>> world_size()
    1
    """
    return 1


def global_ordinal() -> int:
    """0 in every process: the ordinal of the one virtual device (as in PyTorch/XLA's SPMD).

    >>> global_ordinal()
    0
    """
    return 0


def local_ordinal() -> int:
    """This process's rank on its host (PyTorch/XLA: local rank * 1 device + device index 0).

    >>> local_ordinal()
    0
    """
    found = launch_env.from_environment()
    return found.local_rank if found is not None else 0


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process's (local or global) ordinal is 0, as ``xm.is_master_ordinal``.

    With ``local=False`` this is True in every process (``global_ordinal()`` is 0 under
    SPMD); to pick one process of the job, test ``process_index() == 0``.

    >>> is_master_ordinal()
    True
    """
    return (local_ordinal() if local else global_ordinal()) == 0
