"""Routes: where each input of a captured step comes from, and where each value it hands out
goes. Small frozen records, built once by ``capture.py`` and read by ``plan.py``.

A **source** is one data leaf of the recorded graph, as a replay finds its current value:

- :class:`ArgSource` -- a tensor argument of the call;
- :class:`StorageSource` -- a storage that existed before the step (a parameter, an
  optimizer moment, ``p.grad``...), read by identity;
- :class:`RefilledSource` -- the tensor in a slot the step itself refills (a module
  attribute rebound to a new tensor): each call reads what the previous call left there;
- :class:`ConstSource` -- data the step made from host values (uploaded once).

An **output** is one value the step hands out, with its :class:`Target`:

- :class:`ArgTarget` / :class:`StorageTarget` -- written in place into that storage (so
  ``p`` stays ``p``);
- :class:`SlotTarget` -- a new tensor put in a slot (``p.grad`` after ``zero_grad()``);
- :class:`ReturnTarget` -- a tensor the step returns.

A returned tensor that shares data with state outliving the step is no output: an
:class:`AliasReturn` says which state, and a replay returns that state (or the same view
of it), as PyTorch's result would be.

Example::

    captured.sources   # [ArgSource(0), StorageSource(<weakref>, slot=Place(...)), ...]
    captured.outputs   # [Output((node, 0), StorageTarget(<weakref>)), ...]
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Union

from torchspmd.lazy.node import Node
from torchspmd.step.places import Place


@dataclass(frozen=True)
class ArgSource:
    """The call's tensor argument ``position`` (in ``tree_flatten`` order)."""

    position: int


@dataclass(frozen=True)
class StorageSource:
    """A storage that existed before the step. ``slot``: the walked slot whose tensor held
    it, which a replay checks still holds it (else the state moved: capture again)."""

    storage: weakref.ref
    slot: Place | None = None


@dataclass(frozen=True)
class RefilledSource:
    """The storage of the tensor in ``slot``, a slot that the step's output ``output``
    refills with a new tensor: each call reads the tensor the previous call put there
    (``first``: the one the capturing call put there)."""

    slot: Place
    output: int
    first: weakref.ref


@dataclass(frozen=True)
class ConstSource:
    """Data the step made from host values, read as it was at capture."""

    value: tuple[Node, int]


Source = Union[ArgSource, StorageSource, RefilledSource, ConstSource]


@dataclass(frozen=True)
class ArgTarget:
    """Written in place into the storage of the call's tensor argument ``position``."""

    position: int


@dataclass(frozen=True)
class StorageTarget:
    """Written in place into a storage that existed before the step."""

    storage: weakref.ref


@dataclass(frozen=True)
class SlotTarget:
    """A new tensor (``cls``, with ``requires_grad``) put in ``slot``; ``was_empty``: the
    slot held nothing before the step (a replay needs it empty again)."""

    slot: Place
    requires_grad: bool
    cls: type
    was_empty: bool


@dataclass(frozen=True)
class ReturnTarget:
    """A tensor the step returns, at ``position`` in its flattened result."""

    position: int


Target = Union[ArgTarget, StorageTarget, SlotTarget, ReturnTarget]


@dataclass(frozen=True)
class AliasReturn:
    """A tensor the step returns (at ``position`` in its flattened result) that shares
    data with ``holder``: the call's argument (:class:`ArgTarget`), a storage that existed
    before the step (:class:`StorageTarget`; ``tensor``, a weakref to the returned tensor
    when it is the whole storage, e.g. a parameter), or the tensor the step puts in a
    slot (a :class:`Place`, e.g. ``p.grad``). ``meta``, ``view`` and ``identity`` are the
    returned tensor's view of that data (``lazy.handle.Handle``); ``itself``: the returned
    tensor was the holding tensor object (or, for a storage, its whole data).

    In PyTorch ``return model.weight`` returns the parameter, which later steps update in
    place; a replay returns it too, not a copy of one step's value."""

    position: int
    holder: Union[ArgTarget, StorageTarget, Place]
    meta: object
    view: tuple
    identity: bool
    itself: bool
    tensor: weakref.ref | None = None


@dataclass(frozen=True)
class Output:
    """One value the step hands out: the recorded graph value and where it goes."""

    value: tuple[Node, int]
    target: Target
