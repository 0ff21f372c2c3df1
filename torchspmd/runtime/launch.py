"""What a launcher told this process: torchrun's environment, parsed and checked.

``torchrun`` starts each process with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (plus ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``). Those four are read as one
set: none of them means "not launched" (one process, or an explicit
``torchspmd.distributed.initialize``), all of them a multi-process launch, and some of
them a mistake that would otherwise hang or run as one process unnoticed.

Two services need a port on the first host. ``MASTER_PORT`` belongs to
``torch.distributed`` (torchrun's store, and the gloo group DCP uses); JAX's coordinator
listens on the next port, ``MASTER_PORT + 1``, unless ``JAX_COORDINATOR_ADDRESS`` names
another address. Nothing here touches JAX or torch.distributed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Launch", "LaunchError", "from_environment", "coordinator_port", "TORCHRUN_VARS"]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(RuntimeError):
    """The launcher's environment is incomplete or inconsistent."""


@dataclass(frozen=True)
class Launch:
    """One process's place in a launch.

    ``coordinator_address`` is JAX's coordinator (``host:port``); ``torch_store_address``
    is where ``torch.distributed``'s store listens (``None``: its ``env://`` default).

    >>> Launch("10.0.0.1:29501", 2, 1, 1, 2).is_multi_process
    True
    """

    coordinator_address: str
    num_processes: int
    process_id: int
    local_rank: int = 0
    local_world_size: int = 1
    torch_store_address: str | None = None

    @property
    def is_multi_process(self) -> bool:
        return self.num_processes > 1


def coordinator_port(master_port: int) -> int:
    """JAX's coordinator port for torchrun's ``MASTER_PORT``: the next port up.

    >>> coordinator_port(29500)
    29501
    """
    if not 0 < master_port < 65535:
        raise LaunchError(f"MASTER_PORT={master_port} leaves no room for JAX's coordinator "
                          "on the next port; pick a MASTER_PORT below 65535.")
    return master_port + 1


def from_environment(environ: Mapping[str, str] | None = None) -> Launch | None:
    """The torchrun launch described by ``environ`` (default ``os.environ``), or ``None``.

    >>> from_environment({}) is None
    True
    >>> from_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h",
    ...                   "MASTER_PORT": "29500"}).coordinator_address
    'h:29501'
    """
    env = os.environ if environ is None else environ
    present = [v for v in TORCHRUN_VARS if env.get(v, "") != ""]
    if not present:
        return None
    if len(present) != len(TORCHRUN_VARS):
        missing = [v for v in TORCHRUN_VARS if v not in present]
        raise LaunchError(
            f"torchspmd: the environment sets {', '.join(present)} but not "
            f"{', '.join(missing)}. A multi-process launch needs all of "
            f"{', '.join(TORCHRUN_VARS)} (torchrun sets them); unset them all to run as "
            "one process, or call torchspmd.distributed.initialize(...) with explicit "
            "arguments.")
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local_rank = _int(env, "LOCAL_RANK", 0)
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise LaunchError(f"torchspmd: RANK={rank} must be in [0, WORLD_SIZE={world}).")
    if local_world < 1 or not 0 <= local_rank < local_world:
        raise LaunchError(f"torchspmd: LOCAL_RANK={local_rank} must be in "
                          f"[0, LOCAL_WORLD_SIZE={local_world}).")
    host, port = env["MASTER_ADDR"], _int(env, "MASTER_PORT")
    address = env.get("JAX_COORDINATOR_ADDRESS") or f"{host}:{coordinator_port(port)}"
    return Launch(address, world, rank, local_rank, local_world)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name, "")
    if text == "" and default is not None:
        return default
    try:
        return int(text)
    except ValueError:
        raise LaunchError(f"torchspmd: {name}={text!r} is not an integer.") from None
