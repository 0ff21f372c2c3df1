"""Each private-JAX route of ``lowering/jax_private.py`` and its public fallback agree.

The fallback is forced the way a JAX upgrade would force it: the ``_private_*`` reader
raises ``AttributeError`` (a name gone) or ``ImportError`` (a module moved).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from torchspmd.lowering import jax_private


def _mesh(shape, names, order=None):
    devices = jax.devices()
    order = list(range(int(np.prod(shape)))) if order is None else order
    grid = np.empty(len(order), dtype=object)
    grid[:] = [devices[i] for i in order]
    return jax.sharding.Mesh(grid.reshape(shape), names)


def _both(monkeypatch, name, call, error=AttributeError):
    """``call()`` through the private route, then with ``_private_<name>`` gone."""
    private = call()

    def gone(*args, **kwargs):
        raise error(f"{name} is gone from this JAX")

    with monkeypatch.context() as patch:
        patch.setattr(jax_private, f"_private_{name}", gone)
        public = call()
    return private, public


SHARDINGS = {
    "named_tiled": lambda: NamedSharding(_mesh((2, 4), ("x", "y")), P("x", "y")),
    "named_partial": lambda: NamedSharding(_mesh((2, 4), ("x", "y")), P("y")),
    "named_permuted": lambda: NamedSharding(_mesh((4,), ("x",), [3, 1, 0, 2]), P("x")),
    "named_replicated": lambda: NamedSharding(_mesh((2,), ("x",)), P()),
    "single_device": lambda: jax.sharding.SingleDeviceSharding(jax.devices()[5]),
    "replicated_in_id_order": lambda: jax_private._private_replicated_over(tuple(jax.devices()[2:6])),
}


@pytest.mark.parametrize("kind", sorted(SHARDINGS))
def test_device_assignment_fallback_gives_the_same_devices_in_the_same_order(monkeypatch, kind):
    sharding = SHARDINGS[kind]()
    private, public = _both(monkeypatch, "device_assignment",
                            lambda: jax_private.device_assignment(sharding))
    assert private == public and len(private) == len(sharding.device_set)


@pytest.mark.parametrize("kind", sorted(SHARDINGS))
def test_addressable_devices_fallback_gives_the_same_devices(monkeypatch, kind):
    sharding = SHARDINGS[kind]()
    private, public = _both(monkeypatch, "addressable_devices",
                            lambda: jax_private.addressable_devices(sharding))
    assert private == public


@pytest.mark.parametrize("kind", ["named_tiled", "named_partial", "named_permuted"])
def test_tile_layout_fallback_gives_the_same_tiles(monkeypatch, kind):
    """The same tiles; a transposed iota is read as a plain device list (``iota``
    False), which only makes ``in_id_order`` re-express it as a named sharding."""
    sharding = SHARDINGS[kind]()
    for ndim in (1, 2, 3):
        if len(sharding.spec) > ndim:
            continue
        private, public = _both(monkeypatch, "tile_layout",
                                lambda: jax_private.tile_layout(sharding, ndim))
        assert dataclasses.replace(private, iota=public.iota) == public
        assert public.iota == (public.devices == tuple(range(len(public.devices))))
        assert private.iota or not public.iota


def test_tile_layout_fallback_reads_a_replicated_sharding_as_replicated(monkeypatch):
    sharding = SHARDINGS["named_replicated"]()
    private, public = _both(monkeypatch, "tile_layout", lambda: jax_private.tile_layout(sharding, 2))
    assert private == public and public.replicated


def test_logical_device_ids_fallback_reads_none(monkeypatch):
    """Where JAX has no logical device ids, every named sharding is in mesh order."""
    mesh = _mesh((2,), ("x",))
    plain = NamedSharding(mesh, P("x"))
    private, public = _both(monkeypatch, "logical_device_ids",
                            lambda: jax_private.logical_device_ids(plain))
    assert private is None and public is None
    relabelled = jax_private.named_sharding(mesh, P("x"), None, (1, 0))
    assert jax_private.logical_device_ids(relabelled) == (1, 0)


def test_named_sharding_fallback_gives_each_device_the_same_block(monkeypatch):
    mesh = _mesh((4,), ("x",))
    ids = (2, 0, 3, 1)
    private, public = _both(monkeypatch, "named_sharding",
                            lambda: jax_private.named_sharding(mesh, P("x"), None, ids))
    assert jax_private.logical_device_ids(private) == ids
    shape = (8, 3)
    assert private.devices_indices_map(shape) == public.devices_indices_map(shape)


def test_replicated_over_fallback_replicates_over_the_same_devices_in_order(monkeypatch):
    devices = tuple(jax.devices()[i] for i in (4, 1, 6))
    private, public = _both(monkeypatch, "replicated_over",
                            lambda: jax_private.replicated_over(devices))
    assert public.is_fully_replicated and private.is_fully_replicated
    assert jax_private.device_assignment(private) == jax_private.device_assignment(public) == devices


@pytest.mark.parametrize("kind", ["named_tiled", "named_partial", "named_replicated"])
@pytest.mark.parametrize("error", [AttributeError, ImportError])
def test_put_shards_fallback_gives_the_same_array(monkeypatch, kind, error):
    sharding = SHARDINGS[kind]()
    host = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    indices = sharding.addressable_devices_indices_map(host.shape)
    devices = list(indices)
    shards = [host[indices[d]] for d in devices]
    private, public = _both(monkeypatch, "put_shards", lambda: jax_private.put_shards(
        host.shape, host.dtype, sharding, shards, devices), error)
    for array in (private, public):
        assert array.sharding == sharding and array.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(array), host)
        for shard in array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])


def test_backends_started_fallback_answers_false_after_the_private_route_answered(monkeypatch):
    """The devices are up in the test process; the fallback cannot know, and says no
    (``jax.distributed.initialize`` then raises JAX's own error)."""
    private, public = _both(monkeypatch, "backends_started", jax_private.backends_started,
                            ImportError)
    assert private is True and public is False


def test_distributed_arguments_fallback_gives_the_same_arguments(monkeypatch):
    private, public = _both(monkeypatch, "distributed_arguments",
                            jax_private.distributed_arguments, ImportError)
    assert private == public == jax_private.DistributedArguments(None, 1, 0)


@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_shard_alike_built_from_internals_lays_out_alike_as_public_jax(shardy):
    # JAX 0.11 removed jax.experimental.shard_alike; the internal route must do its job.
    mesh = _mesh((2, 4), ("x", "y"))
    tiled = NamedSharding(mesh, P("x", "y"))
    a = jax.device_put(np.arange(64.0).reshape(8, 8), tiled)

    def program(a):
        b = jnp.arange(64.0).reshape(8, 8) + 1  # made inside: no layout of its own
        return tuple(jax_private._private_shard_alike_primitive().bind(a * 2, b))

    was = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        a2, b2 = jax.jit(program)(a)
    finally:
        jax.config.update("jax_use_shardy_partitioner", was)
    assert b2.sharding.is_equivalent_to(tiled, 2) and a2.sharding.is_equivalent_to(tiled, 2)
    np.testing.assert_array_equal(np.asarray(b2), np.arange(64.0).reshape(8, 8) + 1)
