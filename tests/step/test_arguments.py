"""A compiled step's arguments as leaves and a structure (``step/arguments.py``): the
leaves and their order are ``torch.utils._pytree``'s, the structure tells apart what its
spec tells apart, and any container this module does not flatten itself goes to torch."""

import collections
import dataclasses

import pytest
import torch
from torch.utils._pytree import tree_flatten

from torchspmd.step.arguments import TorchSpec, flatten, unflatten

Pair = collections.namedtuple("Pair", "a b")
TREES = [
    ((torch.ones(2), 3), {}),
    (([torch.ones(1), None, [2.0, "s"]], (torch.zeros(3),)), {"b": torch.ones(1), "a": (1, 2)}),
    ((), {"n": None}),
]


@pytest.mark.parametrize("tree", TREES)
def test_plain_containers_flatten_to_torchs_leaves_and_back(tree):
    leaves, structure = flatten(tree)
    expected, _ = tree_flatten(tree)
    assert len(leaves) == len(expected) and all(a is b for a, b in zip(leaves, expected))
    assert not isinstance(structure, TorchSpec)
    hash(structure)
    rebuilt = unflatten(leaves, structure)
    assert tree_flatten(rebuilt)[1] == tree_flatten(tree)[1]


def test_structures_differ_where_torchs_specs_differ():
    shapes = [((1, 2),), ([1, 2],), ((1, (2,)),), ({"a": 1, "b": 2},), ({"b": 2, "a": 1},)]
    structures = [flatten(t)[1] for t in shapes]
    assert len(set(structures)) == len(shapes)


@pytest.mark.parametrize("tree", [(Pair(torch.ones(1), 2),),
                                  (collections.OrderedDict(x=torch.ones(1)),)],
                         ids=["namedtuple", "OrderedDict"])
def test_other_containers_take_torchs_flatten(tree):
    leaves, structure = flatten(tree)
    assert isinstance(structure, TorchSpec)
    assert leaves == tree_flatten(tree)[0]
    assert unflatten(leaves, structure) == tree


@dataclasses.dataclass(frozen=True)
class Batch:
    x: torch.Tensor
    scale: float = 2.0


def test_mappings_and_dataclasses_torch_keeps_whole_are_opened():
    """A ``UserDict`` (what Hugging Face's ``BatchEncoding`` is) by its keys, a dataclass
    by its fields: their tensors are leaves, and they rebuild as their own type."""
    user = collections.UserDict({"ids": torch.ones(2), "n": 3})
    batch = Batch(torch.zeros(1))
    leaves, structure = flatten(((user, batch), {}))
    assert leaves[0] is user["ids"] and leaves[1] == 3 and leaves[2] is batch.x
    assert leaves[3] == 2.0 and not isinstance(structure, TorchSpec)
    hash(structure)
    (again_user, again_batch), _ = unflatten(leaves, structure)
    assert type(again_user) is collections.UserDict and dict(again_user) == dict(user)
    assert type(again_batch) is Batch and again_batch.x is batch.x and again_batch.scale == 2.0
    other = flatten(((collections.UserDict({"n": 3, "ids": torch.ones(2)}), batch), {}))[1]
    assert other != structure  # keys in another order: another structure
