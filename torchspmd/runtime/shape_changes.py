"""One computation compiled again and again for new shapes says so, once, never silently.

XLA compiles a program per shape. A loop whose tensors change shape every iteration (a
greedy decoding loop that concatenates each token, batches of every length) compiles
each iteration: correct, but seconds per step, and nothing said why. A program compiled
for a graph with the same ops, wired the same way, as earlier programs (shapes and static
arguments aside) counts in ``metrics()["shape_recompiles"]``; at the
:data:`WARN_AFTER`-th one of a computation of at least :data:`MIN_OPS` ops a
:class:`ShapeRecompileWarning` names the op whose output shape
changed and what keeps shapes fixed, as ``torch.compile`` warns at its recompile limit.
Code that watches its own shapes (``generate``'s lazy path) runs inside :func:`watched`.

Example::

    for t in range(20):                   # ids grows by one token per iteration
        ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], 1)
        ids.sum().item()                  # the 8th new shape warns
"""

from __future__ import annotations

import contextlib
import warnings

from torchspmd.runtime.cache import LRU
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.user_code import user_stacklevel

__all__ = ["ShapeRecompileWarning", "WARN_AFTER", "MIN_OPS", "note_compile", "watched"]

WARN_AFTER = 8  # programs of one computation (torch._dynamo's recompile limit is 8 too)
# Smaller computations compile in milliseconds: a program that runs a few ops on inputs of
# many sizes (preprocessing, a test suite) recompiles cheaply and is not warned about.
MIN_OPS = 32


class ShapeRecompileWarning(UserWarning):
    """One computation has compiled a program for each of many input shapes."""


# Per computation (bounded, least recently compiled dropped): programs compiled, the
# last one's output shapes, whether it was warned about.
_SEEN = LRU(256)
_WATCHED = [0]  # depth of ``watched()`` blocks: their callers report recompiles themselves


@contextlib.contextmanager
def watched():
    """Recompiles inside are counted, not warned about: the caller names its own remedy."""
    _WATCHED[0] += 1
    try:
        yield
    finally:
        _WATCHED[0] -= 1


def note_compile(graph) -> None:
    """A program is being compiled for ``graph`` (a ``runtime.graph.Graph``)."""
    structure = hash((tuple(n.sig.op for n in graph.nodes), tuple(map(tuple, graph.operands))))
    shapes = [tuple(m.shape) if m is not None else None
              for n in graph.nodes for m in n.sig.outputs[:1]]
    count, last, warned = _SEEN.get(structure) or (0, None, False)
    if last is not None and last != shapes:
        COUNTERS["shape_recompiles"] += 1
    count += 1
    if (count >= WARN_AFTER and not warned and last is not None and not _WATCHED[0]
            and len(graph.nodes) >= MIN_OPS):
        warned = True
        i = next((i for i, (a, b) in enumerate(zip(last, shapes)) if a != b), None)
        what = (f"{graph.nodes[i].sig.op}'s output {last[i]} -> {shapes[i]}" if i is not None
                else "static arguments changed")
        warnings.warn(
            f"torchspmd: one computation ({len(graph.nodes)} ops) has compiled {count} "
            f"programs, one per new shape ({what}); each new shape compiles again. Keep "
            f"shapes fixed: pad inputs to a few sizes, decode with a static cache "
            f"(model.generate(cache_implementation=\"static\"), "
            f"torchspmd.generation.compile_generate), or read debug.pending_hlo() of two "
            f"iterations to see what differs.", ShapeRecompileWarning,
            stacklevel=user_stacklevel())
    _SEEN[structure] = (count, shapes, warned)
