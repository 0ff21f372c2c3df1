"""A compiled step's arguments as leaves and a structure (``step/arguments.py``): the
leaves and their order are ``torch.utils._pytree``'s, the structure tells apart what its
spec tells apart, and any container this module does not flatten itself goes to torch."""

import collections

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
