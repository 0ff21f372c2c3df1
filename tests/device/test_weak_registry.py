"""The live-handle registry: members held weakly, dead ones never returned."""

import gc

import torch

from torchspmd.lazy.handle import PENDING, Storage
from torchspmd.lazy.node import Node, TensorMeta
from torchspmd.lazy.weak_set import WeakRegistry


class _Member:
    __slots__ = ("__weakref__",)


def test_members_are_returned_while_they_live():
    registry = WeakRegistry()
    a, b = _Member(), _Member()
    registry.add(a)
    registry.update([b, a])
    assert set(map(id, registry)) == {id(a), id(b)}
    assert len(registry) == 2
    del a
    gc.collect()
    assert list(registry) == [b]


def test_discard_and_clear():
    registry = WeakRegistry()
    a, b = _Member(), _Member()
    registry.update([a, b])
    registry.discard(a)
    registry.discard(_Member())  # not a member: nothing happens
    assert list(registry) == [b]
    registry.clear()
    assert list(registry) == []


def test_take_returns_the_live_members_in_order_and_empties_the_registry():
    registry = WeakRegistry()
    a, b, c = _Member(), _Member(), _Member()
    registry.update([a, b, c])
    del b
    gc.collect()
    assert registry.take() == [a, c]
    assert list(registry) == []


def test_dead_members_are_pruned_as_they_pile_up():
    registry = WeakRegistry()
    keep = [_Member() for _ in range(3)]
    registry.update(keep)
    for _ in range(3 * WeakRegistry._MIN_LIMIT):
        registry.add(_Member())  # dies at once
    assert len(registry._refs) <= WeakRegistry._MIN_LIMIT + 1
    assert set(map(id, registry)) == set(map(id, keep))


def test_a_reused_id_holds_the_newer_member():
    registry = WeakRegistry()
    registry.add(_Member())  # dies at once; its id may be given to the next object
    newer = _Member()
    registry.add(newer)
    assert list(registry) == [newer]


def test_a_pending_storage_discarded_and_written_again_is_listed_again():
    # A storage notes the generation it joined the pending registry in and skips adding
    # itself again within it; a discard must not leave it out of the next sync.
    meta = TensorMeta((2,), (1,), torch.float32)
    storage = Storage((Node(None), 0), meta)  # pending: no data yet
    assert storage in list(PENDING)
    PENDING.discard(storage)
    storage.set((Node(None), 0))
    assert storage in list(PENDING)
    PENDING.discard(storage)  # leave the registry as it was
