"""What a compiled step refuses, clearly and at capture."""

import pytest
import torch

import torchspmd as xs
from torchspmd.step import CheckMissError, HostReadInStep, RebindingError

DEVICE = xs.device()


@pytest.mark.parametrize("read", [
    lambda t: t.sum().item(),
    lambda t: t.cpu(),
    lambda t: print(t),
    lambda t: bool(t.sum() > 0),
    lambda t: t.tolist(),
])
def test_a_host_read_inside_the_step_names_itself_and_says_to_move_it_out(read):
    @xs.compile
    def step(x):
        y = x * 2
        read(y)
        return y

    with pytest.raises(HostReadInStep, match="move this out of the step"):
        step(torch.ones(3).to(DEVICE))


def test_sync_inside_the_step_is_ignored():
    @xs.compile
    def step(x):
        y = x + 1
        xs.sync()
        return y * 2

    for _ in range(2):
        out = step(torch.ones(3).to(DEVICE))
    torch.testing.assert_close(out.cpu(), torch.full((3,), 4.0))


total = torch.zeros(()).to(DEVICE)


def test_rebinding_a_global_tensor_raises_instead_of_freezing_it():
    @xs.compile
    def step(x):
        global total
        total = total + x.sum()
        return total

    with pytest.raises(RebindingError, match="'total'"):
        step(torch.ones(3).to(DEVICE))


def test_rebinding_a_closure_tensor_raises():
    count = torch.zeros(()).to(DEVICE)

    def step(x):
        nonlocal count
        count = count + 1
        return x * count

    with pytest.raises(RebindingError, match="closure"):
        xs.compile(step)(torch.ones(3).to(DEVICE))


calls = 0


def test_rebinding_a_global_number_raises_instead_of_freezing_it():
    """A replay runs no Python: the counter would stay 1 and the branch on it frozen."""
    weight = torch.ones(3).to(DEVICE)

    @xs.compile
    def step(x):
        global calls
        calls += 1
        weight.mul_(2.0 if calls % 2 else 0.5)
        return weight.sum()

    with pytest.raises(RebindingError, match=r"'calls', a Python number \(0 -> 1\)"):
        step(torch.ones(3).to(DEVICE))


def test_rebinding_a_closure_number_raises():
    first = True

    def step(x):
        nonlocal first
        out = x * 2 if first else x
        first = False
        return out

    with pytest.raises(RebindingError, match=r"closure variable.*\(True -> False\)"):
        xs.compile(step)(torch.ones(3).to(DEVICE))


def test_a_number_the_step_sets_back_before_it_ends_is_fine():
    depth = 0

    def step(x):
        nonlocal depth
        depth += 1
        out = x * depth
        depth -= 1
        return out

    step = xs.compile(step)
    for _ in range(3):
        torch.testing.assert_close(step(torch.ones(3).to(DEVICE)).cpu(), torch.ones(3))


def test_updating_a_global_tensor_in_place_is_replayed():
    counter = torch.zeros(()).to(DEVICE)

    @xs.compile
    def step(x):
        counter.add_(x.sum())
        return counter * 1

    for _ in range(4):
        out = step(torch.ones(3).to(DEVICE))
    assert out.item() == 12.0
    assert counter.item() == 12.0


cache = None


@pytest.mark.parametrize("where", ["global", "closure", "unbound global"])
def test_a_tensor_bound_on_first_use_is_state_later_calls_update(where):
    """``if cache is None: cache = zeros(...)`` in the step: the call that binds it is a
    warm-up, the next captures with the tensor in place. It was captured with the zeros
    made inside the program: each replay added to new zeros (3.0 every call, not 3, 6,
    9, 12) and the global kept the first call's tensor."""
    global cache
    cache = None
    holder = None
    globals().pop("fresh_cache", None)

    def step_global(x):
        global cache
        if cache is None:
            cache = torch.zeros(3).to(DEVICE)
        cache.add_(x)
        return cache.sum()

    def step_closure(x):
        nonlocal holder
        if holder is None:
            holder = torch.zeros(3).to(DEVICE)
        holder.add_(x)
        return holder.sum()

    def step_unbound(x):
        global fresh_cache
        if "fresh_cache" not in globals():
            fresh_cache = torch.zeros(3).to(DEVICE)
        fresh_cache.add_(x)
        return fresh_cache.sum()

    step = xs.compile({"global": step_global, "closure": step_closure,
                       "unbound global": step_unbound}[where])
    sums = [step(torch.ones(3).to(DEVICE)).item() for _ in range(4)]
    assert sums == [3.0, 6.0, 9.0, 12.0]
    assert xs.metrics()["step_replays"] >= 1


def test_binding_a_none_variable_to_a_number_raises():
    limit = None

    def step(x):
        nonlocal limit
        limit = 4
        return x * limit

    with pytest.raises(RebindingError, match=r"bound a closure variable \(None before\) to int 4"):
        xs.compile(step)(torch.ones(3).to(DEVICE))


def test_check_every_names_the_first_op_that_differs():
    # A string: the walk compares the Python numbers a step could read before each
    # replay (a changed one captures again), not other values.
    mode = {"op": "relu"}

    @xs.compile(check_every=2)
    def step(x):
        return torch.relu(x) if mode["op"] == "relu" else torch.tanh(x)

    x = torch.ones(3).to(DEVICE)
    step(x)
    mode["op"] = "tanh"
    with pytest.raises(CheckMissError, match="tanh"):
        step(x)
    assert xs.metrics()["step_check_misses"] >= 1


def test_torch_compile_of_an_spmd_model_gives_eager_results():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(),
                                torch.nn.Linear(8, 2)).to(DEVICE)
    x = torch.randn(3, 4).to(DEVICE)
    compiled = torch.compile(model)
    y = compiled(x)
    y.sum().backward()
    grads = [p.grad.cpu() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(y.cpu(), expected.cpu())
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad.cpu())


def test_torch_compile_does_not_compile_the_devices_dispatch_frame():
    """Under torch.compile, TorchDynamo met ``SpmdTensor.__torch_dispatch__`` as a frame
    to compile, once per argument count, until its recompile limit (warning each time).
    It is skipped now: the frames TorchDynamo compiles are the model's own."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2)).to(DEVICE)
    compiled = torch.compile(model, backend="eager")
    for _ in range(3):
        compiled(torch.randn(3, 4).to(DEVICE)).sum().backward()
    assert counters["frames"]["total"] <= 2


def test_check_every_passes_and_keeps_replaying_when_the_path_is_the_same():
    @xs.compile(check_every=2)
    def step(x):
        return torch.relu(x) * 2

    x = torch.ones(3).to(DEVICE)
    outs = [step(x) for _ in range(5)]
    assert xs.metrics()["step_recaptures_check"] >= 2
    for out in outs:
        torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))


def test_compiling_something_that_is_not_a_function_says_how_to_use_compile():
    with pytest.raises(TypeError, match=r"expected the step function, got 3"):
        xs.compile(3)


class _Trainer:
    def __init__(self):
        self.calls = 0


def test_a_python_number_attribute_the_step_changes_is_refused_by_name():
    """``self.calls += 1`` in the step counted the capture only: replays returned 3.0 and
    left the count at 1 (eager: 3, 6, 9 and 3)."""
    trainer = _Trainer()

    @xs.compile
    def step(x):
        trainer.calls += 1
        return x.sum() * trainer.calls

    with pytest.raises(RebindingError, match=r"changed _Trainer\.calls, a Python number "
                                             r"\(0 -> 1\)"):
        step(torch.ones(3).to(DEVICE))
    assert trainer.calls == 0  # the refused call did not happen


def test_a_refused_step_changes_nothing():
    """Refused after (a rebinding) or during (a host read) its Python: parameters,
    gradients, optimizer state and Python numbers are as before the call, so running the
    fixed step again does not apply the update twice."""
    global calls
    calls = 0
    model = torch.nn.Linear(2, 1).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    weight = model.weight.detach().cpu().clone()

    def rebinds(x):
        global calls
        model(x).sum().backward()
        opt.step()
        calls += 1

    def reads(x):
        model(x).sum().backward()
        opt.step()
        return model.weight.sum().item()

    for step, error in ((rebinds, RebindingError), (reads, HostReadInStep)):
        with pytest.raises(error):
            xs.compile(step)(torch.ones(1, 2).to(DEVICE))
        assert torch.equal(model.weight.detach().cpu(), weight)
        assert model.weight.grad is None and not any(opt.state.values())  # no momentum
        assert calls == 0
