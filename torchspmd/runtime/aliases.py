"""Arrays that share device buffers: a record so that donation never deletes a live one.

Moving data without copying (a replicated array lending its buffers to a sub-mesh, an
array relabeled in another device order, a ``device_put`` JAX satisfies with the same
buffers) gives two ``jax.Array`` objects over one buffer. Donating either deletes the
buffer under both, so each array made that way is noted here with its partner; an array
whose partner is alive is not donated.

Example::

    b = jax.device_put(a, sub_mesh_sharding)   # may reuse a's buffers
    note_shared(a, b)
    shares_buffers(a)                          # True while b is alive
"""

from __future__ import annotations

import weakref

import jax

__all__ = ["note_shared", "shares_buffers"]

# id(array) -> (a weak reference to it, weak references to arrays sharing its buffers).
# Arrays are unhashable, so they are keyed by id; the entry goes when the array does.
_SHARED: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}


def note_shared(a: jax.Array, b: jax.Array, check: bool = True) -> None:
    """Record that ``a`` and ``b`` may hold the same buffers (with ``check``, only if
    some device buffer of one is one of the other's).

    Sharing is transitive: ``b`` also shares with every live array ``a`` shares with
    (a relabeled intermediate may die while the original and the result live on).
    """
    if a is b or (check and not _overlap(a, b)):
        return
    group = [a, b, *_partners(a), *_partners(b)]
    members = list({id(x): x for x in group}.values())
    for x in members:
        entry = _SHARED.get(id(x))
        if entry is None or entry[0]() is not x:
            entry = _SHARED[id(x)] = (weakref.ref(x, _forget(id(x))), [])
        entry[1][:] = [weakref.ref(y) for y in members if y is not x]


def _partners(array: jax.Array) -> list[jax.Array]:
    entry = _SHARED.get(id(array))
    if entry is None or entry[0]() is not array:
        return []
    return [y for y in (r() for r in entry[1]) if y is not None]


def shares_buffers(array: jax.Array, ignore: jax.Array | None = None) -> bool:
    """Whether another live array (other than ``ignore``) may hold ``array``'s buffers."""
    if id(array) not in _SHARED:  # most arrays: asked of every donation candidate
        return False
    return any(y is not ignore for y in _partners(array))


def _forget(key: int):
    def callback(ref: weakref.ref) -> None:
        entry = _SHARED.get(key)
        if entry is not None and entry[0] is ref:
            del _SHARED[key]
    return callback


def _overlap(a: jax.Array, b: jax.Array) -> bool:
    try:
        mine = {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}
        return any(s.data.unsafe_buffer_pointer() in mine for s in b.addressable_shards)
    except Exception:  # noqa: BLE001  (a layout without plain pointers: assume shared)
        return True
