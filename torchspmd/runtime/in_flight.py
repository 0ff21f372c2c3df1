"""What the devices are still running, and what finished runs consumed.

A device runs programs in order, so the latest run's outputs on a device set stand for
everything before them: waiting for those waits for all (``wait_device_ops``), and each
is one more reference to its array that donation must not mistake for a holder
(``in_flight_ids``). What a run consumed (donated arrays, old values, a lazy run's
graph) is kept until the host next waits for the devices, or before the next run at the
latest (``release_spent``): freeing costs host time (~1 µs per array on one device,
~4 µs per 8-shard array), which before a launch delays the launch, while the host waits
for the devices it delays nothing. A compiled step's leftovers are the exception: a
read keeps them, and the step's next call, if no other run came in between, frees them
just after its own launch (``spent_only_by``): they are none of its donated inputs, and
freed after the call made its own new arrays they keep Python's garbage collector from
being due.

Example::

    note_in_flight(outputs)          # after a launch
    release_later(graph_inputs)      # torn down once the host waits
    wait_device_ops()                # frees what was spent, blocks on the outputs
"""

from __future__ import annotations

import jax

__all__ = ["note_in_flight", "in_flight_ids", "release_later", "release_spent",
           "spent_only_by", "wait_device_ops"]

# The latest run's outputs per device set (a registry the design names).
_IN_FLIGHT: dict[frozenset, list] = {}
# What the latest runs consumed, freed by ``release_spent``: (who ran, what it consumed).
_SPENT: list[tuple[object, object]] = []


def note_in_flight(arrays: list) -> None:
    """``arrays`` are the latest outputs on their devices (``wait_device_ops`` waits on them)."""
    if arrays:
        _IN_FLIGHT[frozenset(d.id for d in arrays[0].sharding.device_set)] = arrays


def in_flight_ids() -> set[int]:
    """``id`` of every array the in-flight lists hold (each is one more reference to it)."""
    return {id(a) for arrays in _IN_FLIGHT.values() for a in arrays}


def release_later(spent, by: object = None) -> None:
    """Keep ``spent`` (what a call of ``by`` consumed) until the host next waits for the
    devices."""
    _SPENT.append((by, spent))


def spent_only_by(by: object) -> bool:
    """Whether all that is kept for release was consumed by calls of ``by``."""
    return all(who is by for who, _ in _SPENT)


def release_spent(keep_steps: bool = False) -> None:
    """Free what runs consumed. Called before a host read or wait blocks (the devices
    still compute), and before each run's donation analysis, so that what it keeps never
    counts as a holder of a value.

    ``keep_steps`` (a host read) keeps what compiled steps consumed: a step's next call
    frees it just after its own launch. Python counts the containers made minus those
    freed, never below zero, and collects garbage when the count passes 700; a call
    makes ~4 per parameter (new arrays, values), so freed before the call, the old ones
    would not offset them and a large step would be due a collection on every call.
    """
    if not _SPENT:
        return
    if keep_steps:
        _SPENT[:] = [entry for entry in _SPENT if entry[0] is not None]
    else:
        _SPENT.clear()


def wait_device_ops() -> None:
    """Block until every computation started so far has finished."""
    release_spent()
    # A donated buffer was consumed by a later program, which is waited on instead.
    jax.block_until_ready([a for arrays in _IN_FLIGHT.values() for a in arrays
                           if not a.is_deleted()])
    _IN_FLIGHT.clear()
