"""Host <-> device copies, bit-exact for every dtype, with byte counters.

With several processes, a process can only touch its own (addressable) devices:

- host data enters shard by shard: every process passes the same whole value and
  uploads only the shards of its devices (:func:`upload`), or passes its own slice of
  a batch (:func:`upload_process_local`);
- reading a value that other processes hold is a collective (:func:`download`): every
  process must call it, in the same order, or the ones that do wait for the others;
- data moves between device sets only inside one program (:func:`reshard`).
"""

from __future__ import annotations

import functools
import math

import jax
import ml_dtypes
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec

from torchspmd.jax_setup import devices
from torchspmd.lowering.xla_shardings import constraint_for, replicated_over
from torchspmd.lowering import jax_private
from torchspmd.runtime.ownership import note_shared
from torchspmd.runtime.metrics import COUNTERS


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of host tensor ``t`` (bfloat16 through its bits, so nothing rounds);
    a tensor of another PyTorch device (CUDA) is copied to the CPU first."""
    t = t.detach()
    if t.device.type == "meta":  # PyTorch's own error for the same mistake on CPU or CUDA
        raise NotImplementedError(
            "Cannot copy out of meta tensor; no data! Please use torch.nn.Module.to_empty() "
            "instead of torch.nn.Module.to() when moving module from meta to a different "
            "device.")
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj() or t.is_neg():  # lazy bits numpy cannot read
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        t = t.contiguous()  # viewed as int16 below, which needs unit strides
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    # One copy, in C order whatever ``t``'s strides (a batch sliced from a bigger tensor):
    # ``contiguous()`` first would copy twice, and a batch is uploaded every step.
    return t.numpy().copy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor holding numpy array ``a`` (bfloat16 through its bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.array(a, copy=True).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def replicated() -> jax.sharding.Sharding:
    """Unsharded data's layout: replicated over every device (PyTorch/XLA's virtual device)."""
    return replicated_on(tuple(range(len(devices()))))


@functools.cache
def replicated_on(ids: tuple[int, ...]) -> jax.sharding.Sharding:
    """Replicated over the devices ``ids``, in that order (a mesh-free sharding: the
    sharded inputs of a program decide its output layouts)."""
    return replicated_over(tuple(devices()[i] for i in ids))


def upload(host: np.ndarray, sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """Put ``host`` (the same whole value in every process) on the devices.

    Each device receives only its own shard, and each process sends only the shards of
    its own devices. Data annotated with an uneven sharding goes replicated on its
    devices (``placement_for``), over its devices in id order (``in_id_order``).
    """
    placed = replicated() if sharding is None else constraint_for(sharding, host.shape)
    if host.dtype.kind in "biufc":
        array = _put_shards(host, placed)
    else:
        array = jax.make_array_from_callback(host.shape, placed,
                                             lambda index: np.asarray(host[index]), dtype=host.dtype)
    COUNTERS["bytes_to_device"] += _bytes_on_devices(array)
    return array


def _put_shards(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """What ``make_array_from_callback`` does with a numpy array of a plain dtype, less its
    per-call checks and callbacks (a batch is uploaded every step: ~10-15 us of host time
    saved per tensor): each of this process's devices receives its own shard."""
    if sharding.is_fully_replicated:
        devices = jax_private.addressable_devices(sharding)
        shards = [host] * len(devices)
    else:
        indices = sharding.addressable_devices_indices_map(host.shape)
        devices = list(indices)
        shards = [host[indices[d]] for d in devices]
    return jax_private.put_shards(host.shape, host.dtype, sharding, shards, devices)


def upload_leaf(leaf, sharding: jax.sharding.Sharding | None = None) -> None:
    """Send a host leaf (a ``lazy.node.Node`` holding ``host`` data) to the devices, where
    the sharding it was marked with places it (else ``sharding``; else replicated).

    >>> upload_leaf(Node.from_host(np.ones(4), meta))  # doctest: +SKIP
    """
    leaf.arrays = [upload(leaf.host, leaf.sharding or sharding)]
    leaf.host = None


def upload_process_local(local: np.ndarray, sharding: jax.sharding.Sharding,
                         global_shape: tuple[int, ...]) -> jax.Array:
    """A ``global_shape`` array laid out as ``sharding`` from this process's slice ``local``.

    The slice is what this process's devices hold along the dims the sharding splits
    across processes (e.g. a data loader's share of the global batch); in one process
    it is the whole value.
    """
    array = jax.make_array_from_process_local_data(sharding, local, global_shape)
    COUNTERS["bytes_to_device"] += _bytes_on_devices(array)
    return array


def _bytes_on_devices(array: jax.Array) -> int:
    """The bytes ``array`` holds on this process's devices (from its layout: walking its
    shards costs more host time than the upload itself)."""
    sharding = array.sharding
    try:
        shard = sharding.shard_shape(array.shape)
    except ValueError:  # an uneven layout: count the shards
        return sum(s.data.nbytes for s in array.addressable_shards)
    return math.prod(shard) * array.dtype.itemsize * len(sharding.addressable_devices)


def download(array: jax.Array) -> np.ndarray:
    """The full value of ``array`` on the host, in every process.

    With several processes this is a collective that every process must join (the
    data may live on other processes' devices), except for a replicated value that
    every process holds a copy of, which is read locally.
    """
    if jax.process_count() == 1:
        host = np.asarray(array)
    else:
        try:
            host = _gather(array)
        except jax.errors.JaxRuntimeError as error:  # the work or the gather crossed a dead peer
            raise RuntimeError(
                f"torchspmd: process {jax.process_index()} could not read a value because a "
                "collective with the other processes failed: another process died, or does "
                "not run the same program (every process must run the same graphs and "
                f"reads, in the same order). {error}") from None
    COUNTERS["bytes_to_host"] += host.nbytes
    return host


def _gather(array: jax.Array) -> np.ndarray:
    if not array.sharding.is_fully_replicated:
        array = _replicate(array, jax_private.device_assignment(array.sharding))
    holders = sorted({d.process_index for d in array.sharding.device_set})
    mine = (np.asarray(array.addressable_data(0))
            if jax.process_index() in holders else None)
    if len(holders) == jax.process_count():
        return mine
    return _broadcast(mine, array.shape, array.dtype, source=holders[0])


def _identity(x):
    return x


def _replicate(array: jax.Array, device_assignment) -> jax.Array:
    """``array`` replicated over its own devices (an all-gather among them)."""
    target = jax_private.replicated_over(tuple(device_assignment))
    return jax.jit(_identity, out_shardings=target)(array)


def _process_mesh() -> jax.sharding.Mesh:
    grid = np.array(jax.devices()).reshape(jax.process_count(), -1)
    return jax.sharding.Mesh(grid, ("processes", "local"))


@functools.cache
def _take_row(source: int):
    """A jitted ``x[source]`` replicated everywhere: process ``source``'s row, bit-exact."""
    everywhere = NamedSharding(_process_mesh(), PartitionSpec())
    return jax.jit(lambda x: x[source], out_shardings=everywhere)


def _broadcast(value: np.ndarray | None, shape, dtype, source: int) -> np.ndarray:
    """Process ``source``'s ``value`` in every process (the others pass ``None``)."""
    local = value if value is not None else np.zeros(shape, dtype)
    rows = NamedSharding(_process_mesh(), PartitionSpec("processes"))
    stacked = jax.make_array_from_process_local_data(
        rows, np.asarray(local)[None], (jax.process_count(), *shape))
    return np.asarray(_take_row(source)(stacked).addressable_data(0))


def addressable_buffers(array: jax.Array) -> dict[jax.Device, jax.Array]:
    """This process's per-device buffers of ``array``."""
    return {s.device: s.data for s in array.addressable_shards}


def reshard(array: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """``array`` laid out as ``sharding``, device to device where JAX can.

    Across processes JAX moves data only within one device set. A replicated array
    lends its local buffers to any subset of its devices; anything else moving to
    another device set goes through the host (a collective every process joins).
    """
    if jax.process_count() == 1 or array.sharding.device_set == sharding.device_set:
        result = jax.device_put(array, sharding)
    elif array.sharding.is_fully_replicated and sharding.device_set <= array.sharding.device_set:
        result = jax.device_put(restricted(array, jax_private.device_assignment(sharding)), sharding)
    else:
        return upload(download(array), sharding)
    note_shared(array, result)  # JAX moves no data where a device already holds it
    return result


def restricted(array: jax.Array, device_assignment) -> jax.Array:
    """Replicated ``array`` as an array replicated on just ``device_assignment``.

    Uses the buffers ``array`` already holds on those devices (no copy).
    """
    target = jax_private.replicated_over(tuple(device_assignment))
    buffers = addressable_buffers(array)
    result = jax.make_array_from_single_device_arrays(
        array.shape, target, [buffers[d] for d in jax_private.addressable_devices(target)],
        dtype=array.dtype)
    note_shared(array, result, check=False)
    return result


def read_local(array: jax.Array) -> np.ndarray:
    """A host copy of an array this process holds whole (one device's buffer); no collective."""
    host = np.asarray(array)
    COUNTERS["bytes_to_host"] += host.nbytes
    return host
