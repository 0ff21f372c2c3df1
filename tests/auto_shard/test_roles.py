"""auto_shard's decisions come from the module structure: repeated layers share a role,
Megatron units are found from the linears' features."""

import torch
from torch import nn

from torchspmd.auto_shard.roles import find_groups
from torchspmd.testing.models import TinyTransformer


def test_repeated_blocks_share_one_role_per_layer_kind():
    """Three alike blocks give one group per unit (counted three times), not three."""
    groups = find_groups(TinyTransformer(layers=3), (torch.zeros(2, 16, dtype=torch.long),))
    assert [(g.role, g.kind, g.count) for g in groups] == [
        ("blocks.*.qkv+proj", "unit", 3), ("blocks.*.up+down", "unit", 3),
        ("head", "linear", 1), ("pos", "embedding", 1), ("tok", "embedding", 1)]


def test_an_activation_between_linears_keeps_them_one_unit():
    """Linear, GELU, Linear in a Sequential is a column/row unit (the GELU has no
    parameters); a LayerNorm between them would split it."""
    mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    assert [g.kind for g in find_groups(mlp, (torch.zeros(2, 8),))] == ["unit"]
    split = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 8))
    assert [g.kind for g in find_groups(split, (torch.zeros(2, 8),))] == ["linear", "linear"]
