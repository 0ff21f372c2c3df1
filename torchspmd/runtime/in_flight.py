"""What the devices are still running, and what finished runs consumed.

A device runs programs in order, so the latest run's outputs on a device set stand for
everything before them: waiting for those waits for all (``wait_device_ops``), and each
is one more reference to its array that donation must not mistake for a holder
(``in_flight_ids``). What a run consumed (donated arrays, old values, a lazy run's
graph) is kept until the host next waits for the devices, or before the next run at the
latest (``release_spent``): freeing costs host time (~4 µs per donated 8-shard array),
which before a launch delays the launch, while the host waits for the devices it delays
nothing.

Example::

    note_in_flight(outputs)          # after a launch
    release_later(graph_inputs)      # torn down once the host waits
    wait_device_ops()                # frees what was spent, blocks on the outputs
"""

from __future__ import annotations

import jax

__all__ = ["note_in_flight", "in_flight_ids", "release_later", "release_spent",
           "wait_device_ops"]

# The latest run's outputs per device set (a registry the design names).
_IN_FLIGHT: dict[frozenset, list] = {}
# What the latest runs consumed, freed by ``release_spent``.
_SPENT: list = []


def note_in_flight(arrays: list) -> None:
    """``arrays`` are the latest outputs on their devices (``wait_device_ops`` waits on them)."""
    if arrays:
        _IN_FLIGHT[frozenset(d.id for d in arrays[0].sharding.device_set)] = arrays


def in_flight_ids() -> set[int]:
    """``id`` of every array the in-flight lists hold (each is one more reference to it)."""
    return {id(a) for arrays in _IN_FLIGHT.values() for a in arrays}


def release_later(spent) -> None:
    """Keep ``spent`` (what a call consumed) until the host next waits for the devices."""
    _SPENT.append(spent)


def release_spent() -> None:
    """Free what runs consumed. Called before a host read or wait blocks (the devices
    still compute), and before each run's donation analysis, so that what it keeps never
    counts as a holder of a value."""
    if _SPENT:
        _SPENT.clear()


def wait_device_ops() -> None:
    """Block until every computation started so far has finished."""
    release_spent()
    # A donated buffer was consumed by a later program, which is waited on instead.
    jax.block_until_ready([a for arrays in _IN_FLIGHT.values() for a in arrays
                           if not a.is_deleted()])
    _IN_FLIGHT.clear()
