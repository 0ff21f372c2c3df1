"""Host reads run every pending computation, not only the graph of the value read.

Running just the graph a read needs leaves the rest pending: in a loop that reads a value
every iteration (``x = x * 2; x.sum().item()``, a generation loop checking its stopping
criteria) the unread work of each iteration stays pending, so each read compiles and
re-executes a graph that holds every earlier iteration, larger each time. Running
everything that live tensors hold at the read (as ``sync()`` does), together with the
value read, leaves every live tensor as data; the next iteration starts from data and
its graph is the same every time, so it is compiled once. Example::

    x = torch.ones(4, device="spmd")
    for _ in range(100):
        x = x * 2
        x.sum().item()      # 2 graphs compiled in all: the first iteration, then the rest
"""

from __future__ import annotations

import jax

from torchspmd.lazy.handle import PENDING, PENDING_VIEWS
from torchspmd.lazy.node import Node
from torchspmd.runtime import execute

__all__ = ["read"]


def read(values: list[tuple[Node, int]]) -> list[jax.Array]:
    """The arrays of ``values``, after running them and all other pending work as one step.

    The values read are outputs of the same programs as the pending work, so a value only
    the read wants (a temporary such as ``x.sum()``) is computed from the same inputs in
    the same program as the updates that replace those inputs. If the other pending work
    cannot run (tensors on two meshes in one computation, say), the read runs just what
    it needs, as ``materialize`` does, and that work stays pending: its error belongs to
    whoever reads or syncs it. Work that failed to compile or launch raises its error
    only when its own values are read (see ``failure``).
    """
    storages, views, pending = execute.take_pending()
    wanted = execute.wanted_outputs(pending + list(values))
    try:
        execute.execute(sorted(wanted, key=lambda n: n.seq), wanted,
                        execute.successors(storages))
    except Exception:  # noqa: BLE001  (the unrelated work's error is raised when it is read)
        # A computation that failed to compile or run now raises its error when its
        # values are read (``failure``); work that did not run stays pending.
        PENDING.update(s for s in storages if not s.value[0].is_leaf)
        PENDING_VIEWS.update(h for h in views if h.pending_view_value() is not None)
    return execute.materialize(list(values))
