"""Handles: what an spmd tensor holds. Bases own a Storage; views re-derive from it.

PyTorch semantics say a view and its base share memory: ``x[0].add_(1)`` changes ``x``,
and ``x.add_(1)`` changes every view of ``x``. Values here are immutable graph values,
so a Storage keeps the *current* value of the base and a version number; a view keeps
the chain of view ops that derives it from the base, re-derived lazily when the version
moved, and a write to a view is scattered back into a new base value (``views.py``).
"""

from __future__ import annotations

from torchspmd.lazy import provenance
from torchspmd.lazy.node import IDENTITY_IDS, Node, TensorMeta
from torchspmd.lazy.record import record_unary
from torchspmd.lazy.weak_set import WeakRegistry
from torchspmd.lowering.annotation_ops import SHARDING_CONSTRAINT
from torchspmd.lazy.views import derive, write_back

# Storages whose value is still a pending graph, and views whose derived value is:
# ``sync()`` computes exactly these. The design's live-handle registry; weak, so a
# dropped tensor's graph is never run.
PENDING = WeakRegistry()  # of Storage
PENDING_VIEWS = WeakRegistry()  # of Handle
_RECORDING = provenance.ACTIVE
_EPOCH = provenance.EPOCH


class Storage:
    """The current value of a base tensor, shared by the base and all its views."""

    # ``address``: set only once asked for (``device.tensor.StorageKey``).
    __slots__ = ("value", "meta", "version", "origin", "kept", "listed", "address",
                 "__weakref__")

    def __init__(self, value: tuple[Node, int], meta: TensorMeta):
        self.meta = meta
        self.version = 0
        self.value = value
        # (seq, index) of the data this storage held before its value became pending: the
        # buffer its new value may take over when the step runs (``execute.sync``).
        self.origin = None
        # A sharding constraint an in-place op added to keep the storage's annotation
        # (see ``unkept``); meaningful only while it is still ``value``.
        self.kept = None
        # The PENDING generation this storage was last added in (see ``set``).
        self.listed = -1
        node = value[0]
        if node.arrays is None and node.host is None:  # not ``is_leaf``: a call per op
            PENDING.add(self)
            self.listed = PENDING.generation
        if _RECORDING[0] is not None:
            provenance.created(self)

    def set(self, value: tuple[Node, int]) -> None:
        if _RECORDING[0] is not None:
            provenance.wrote(self)
        old = self.value[0]
        if old.arrays is not None:
            self.origin = (old.seq, self.value[1])
        self.value = value
        self.version += 1
        node = value[0]
        # Not ``is_leaf``: a call per write. A storage added since the registry was last
        # emptied is still in it (it lives): an optimizer's later writes add nothing.
        if node.arrays is None and node.host is None and self.listed != PENDING.generation:
            PENDING.add(self)
            self.listed = PENDING.generation


def unkept(storage: Storage):
    """The value under ``storage``'s current value if that is a pending constraint an
    in-place op added only to keep the storage's annotation, else None.

    The next in-place op on the storage reads this instead: it constrains its own result
    again, so a chain of updates (an optimizer's) is constrained once, where the value
    leaves the graph or another op reads it, rather than after every op. A constraint is
    an identity on the data, so the values are the same.
    """
    kept = storage.kept
    if kept is None or kept is not storage.value:
        return None
    node = kept[0]
    if node.arrays is not None or node.host is not None:  # computed by a sync since
        return None
    return node.inputs[0]


class Handle:
    """A tensor's lazy state: its storage, and the view chain from the storage's base."""

    __slots__ = ("storage", "view", "meta", "annotation", "identity", "_cached",
                 "_cached_version", "_cached_epoch", "__weakref__")

    def __init__(self, storage: Storage, meta: TensorMeta, view: tuple = (), cached=None,
                 identity: bool = False):
        self.storage = storage
        self.meta = meta
        self.view = view  # () for a base; else a tuple of views.ViewStep
        self.annotation = None  # a view's own sharding annotation (see ``hold``)
        # A chain of identity views only (``nn.Parameter``, ``detach()``): its value is
        # the storage's, with no view node of its own in the graph (which would make the
        # program compute and return the same data twice).
        self.identity = identity
        self._cached_version = storage.version
        self._cache(cached)

    def _cache(self, value) -> None:
        self._cached = value
        self._cached_epoch = _EPOCH[0]
        if value is not None and value[0].arrays is None and value[0].host is None:
            PENDING_VIEWS.add(self)  # pending (``is_leaf`` inline: a call per view op)

    def pending_view_value(self):
        """This view's derived value if it is current and still to be computed, else None."""
        if (self._cached is not None and not self.identity and self._cached_version == self.storage.version
                and not self._cached[0].is_leaf):
            return self._cached
        return None

    @classmethod
    def new(cls, value: tuple[Node, int], meta: TensorMeta) -> "Handle":
        return cls(Storage(value, meta), meta)

    @property
    def whole(self) -> bool:
        """Whether this tensor is its storage as it is: a base, or identity views only (an
        ``nn.Parameter`` over a tensor, ``detach()``), not part of it or reshaped."""
        return not self.view or self.identity

    def value(self) -> tuple[Node, int]:
        """The tensor's current graph value (a view is re-derived if its base changed)."""
        if _RECORDING[0] is not None:
            provenance.touched(self.storage)
            if self._cached_epoch != _EPOCH[0]:  # cached before this recording began
                self._cached = None
        if not self.view or self.identity:  # ``whole``, inline: a call per read
            return self.storage.value
        if self._cached is None or self._cached_version != self.storage.version:
            self._cached_version = self.storage.version
            value = derive(self.storage.value, self.storage.meta, self.view)
            if self.annotation is not None:
                value = record_unary(SHARDING_CONSTRAINT, value, self.annotation)
            self._cache(value)
        return self._cached

    def stored_node(self) -> Node:
        """The node behind the storage's current value: the base's, whatever view this is.

        Unlike :meth:`value` it derives nothing and is not noted as a read while a step
        records. For a tensor ``x = torch.ones(2, device="spmd")``,
        ``x.handle.stored_node() is x.handle.value()[0]``; after ``x.add_(1)`` it is the add.
        """
        return self.storage.value[0]

    def assign(self, value: tuple[Node, int]) -> None:
        """In-place update: this tensor now holds ``value`` (its base and views see it)."""
        if not self.view:
            self.storage.set(value)
            return
        if self.identity:  # written as its base is, keeping the storage's annotation
            write_back(self.storage, (), value)
            return
        write_back(self.storage, self.view, value)
        self._cached_version = self.storage.version
        self._cache(value)

    def hold(self, value: tuple[Node, int], annotation) -> None:
        """This view now shows ``value``: its data, annotated with ``annotation`` (a sharding
        or None), which the view keeps when its base changes. Nothing is written back: a
        base's data does not change when a view of it is annotated (and an ``expand``
        cannot be written through)."""
        self.annotation = annotation
        self._cached_version = self.storage.version
        self._cache(value)

    def viewed(self, step, value: tuple[Node, int] | None, meta: TensorMeta) -> "Handle":
        """A handle for the view ``step`` of this tensor, whose value is ``value``.

        An identity view (``detach()``) of a base or of an identity view shows the
        storage's value itself: ``value`` is not kept (it may be ``None``).
        """
        if (not self.view or self.identity) and id(step.op) in IDENTITY_IDS:
            return Handle(self.storage, meta, self.view + (step,), identity=True)
        return Handle(self.storage, meta, self.view + (step,), value)
