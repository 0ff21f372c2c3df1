"""``MarkShardingFunction`` under AOTAutograd: the traced graphs keep the constraint.

``functorch.compile.aot_function`` traces on fake tensors; the forward and backward graphs
each keep one ``torchspmd.sharding_constraint`` node, and running them on spmd tensors
gives CPU's values with the gradient laid out as annotated (as PyTorch/XLA's
``MarkShardingFunction`` promises: "can also be used in AOTAutograd").
"""

import numpy as np
import pytest
import torch
from functorch.compile import aot_function, make_boxed_func

import torchspmd
from torchspmd.sharding import MarkShardingFunction, Mesh, get_sharding

DEV = torchspmd.device()
MESH = Mesh(np.arange(8), (8,), ("x",))
ROWS = "{devices=[8,1]0,1,2,3,4,5,6,7}"
A = torch.arange(32.).reshape(8, 4) / 7


def _step(a):
    b = MarkShardingFunction.apply(a, MESH, ("x", None))
    return (b.sin() * 2).sum()


def _compiled(graphs: list):
    def compiler(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    return aot_function(_step, fw_compiler=compiler, bw_compiler=compiler)


def _cpu_reference():
    a = A.clone().requires_grad_()
    loss = (a.sin() * 2).sum()
    loss.backward()
    return loss.detach(), a.grad


def test_forward_and_backward_graphs_each_keep_one_constraint():
    graphs = []
    _compiled(graphs)(A.to(DEV).requires_grad_()).backward()
    ops = [[n.target for n in g.graph.nodes if n.op == "call_function"] for g in graphs]
    constraint = torch.ops.torchspmd.sharding_constraint.default
    assert [op.count(constraint) for op in ops] == [1, 1]


def test_compiled_loss_and_gradient_match_cpu():
    x = A.to(DEV).requires_grad_()
    loss = _compiled([])(x)
    loss.backward()
    expected_loss, expected_grad = _cpu_reference()
    torch.testing.assert_close(loss.cpu(), expected_loss)
    torch.testing.assert_close(x.grad.cpu(), expected_grad)


def test_compiled_gradient_is_laid_out_as_annotated():
    x = A.to(DEV).requires_grad_()
    _compiled([])(x).backward()
    torchspmd.sync()
    assert get_sharding(x.grad) == ROWS


def test_eager_mark_sharding_function_shows_the_spec_and_matches_cpu():
    x = A.to(DEV).requires_grad_()
    y = MarkShardingFunction.apply(x, MESH, ("x", None))
    assert get_sharding(y) == ROWS
    (y.sin() * 2).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), _cpu_reference()[1])


def test_a_cpu_tensor_is_refused_with_pytorch_xlas_message():
    with pytest.raises(RuntimeError, match="Expected XLA tensor"):
        MarkShardingFunction.apply(A, MESH, ("x", None))


def test_a_spec_of_the_wrong_rank_is_refused_before_tracing():
    with pytest.raises(AssertionError, match="Partition spec length"):
        MarkShardingFunction.apply(A.to(DEV), MESH, ("x",))
