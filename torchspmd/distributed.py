"""Running one SPMD program over several processes (one or more per host).

Under ``torchrun`` nothing needs to be called: ``import torchspmd`` reads torchrun's
environment and joins the processes together. For Slurm, mpirun or a hand-written
launcher, call :func:`initialize` right after ``import torchspmd``::

    import torchspmd, torchspmd.distributed
    torchspmd.distributed.initialize("10.0.0.1:1234", num_processes=4, process_id=rank)

Every process then sees every device (``torchspmd.device_count()`` counts them all; a
``Mesh`` names global device ids) and must run the same program: the same ops, the same
``mark_sharding`` calls, the same ``sync()``s and reads, in the same order. Reading a
sharded value (``.cpu()``, ``.item()``, ``print``) gathers it from every process: all
processes must read it, or the ones that do wait forever for the others.

Ports: JAX's coordinator listens on ``coordinator_address``; under torchrun that is
``MASTER_ADDR:MASTER_PORT + 1`` (torchrun's ``MASTER_PORT`` is torch.distributed's).
``torch.distributed`` (gloo, used by ``torch.distributed.checkpoint``) is started by
:func:`init_torch_distributed`, which the checkpoint planners call for you: under
torchrun on ``MASTER_PORT``, otherwise on the coordinator's port + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchspmd.runtime import launch, processes

__all__ = ["initialize", "is_initialized", "init_torch_distributed"]


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
               *, heartbeat_timeout_s: int | None = None) -> None:
    """Join this process to the others of the program (JAX's ``jax.distributed``).

    Args:
      coordinator_address: ``host:port`` where process 0 serves JAX's coordinator.
      num_processes: how many processes run the program.
      process_id: this process's index, in ``[0, num_processes)``.
      local_device_ids: the local devices this process drives (default: all of them).
      heartbeat_timeout_s: a process silent this long is declared dead and the others
        stop with an error (default ``TORCHSPMD_HEARTBEAT_TIMEOUT``, else 100 s).

    Arguments left ``None`` come from torchrun's environment, else from JAX's cluster
    detection (Slurm, Open MPI, TPU pods). Must be called before anything uses a device.
    Calling it again is a no-op if the arguments agree with the running setup (torchrun
    launches start it at import), and a ``RuntimeError`` otherwise.

    Example::

        >>> torchspmd.distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)
        >>> torchspmd.runtime.process_count()
        2
    """
    requested = (coordinator_address, num_processes, process_id)
    running = processes.started_as()
    if running is not None:
        if any(want is not None and want != have for want, have in zip(requested, running)):
            raise RuntimeError(
                f"torchspmd: the multi-process runtime already runs as (coordinator, "
                f"processes, process id) = {running}; initialize{requested} disagrees.")
        return
    found = launch.from_environment()
    if all(r is None for r in requested) and found is not None:
        if not found.is_multi_process:
            return  # torchrun with one process: nothing to join
        requested = (found.coordinator_address, found.num_processes, found.process_id)
    processes.start(*requested, local_device_ids=local_device_ids,
                    heartbeat_timeout_s=heartbeat_timeout_s)


def is_initialized() -> bool:
    """Whether this process joined a multi-process runtime.

    >>> torchspmd.distributed.is_initialized()
    False
    """
    return processes.is_started()


def init_torch_distributed() -> None:
    """Start ``torch.distributed``'s gloo group over the processes (no-op if one process
    or already started). ``torchspmd.checkpoint``'s planners call it for you.

    >>> torchspmd.distributed.init_torch_distributed()
    """
    processes.init_torch_distributed()
