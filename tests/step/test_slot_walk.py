"""The slots a compiled step tracks are found by walking from its arguments, closure and
globals, at most 6 levels deep and not under a module's ``_``-prefixed non-tensor
attributes. Within those limits a new tensor put in a slot is written there on every
replay; beyond them it raises at capture, never goes stale at replay. Storages updated in
place are tracked wherever they live, and a slot beyond the limits that the step reads is
checked before each replay as a walked one is."""

import collections
import dataclasses

import pytest
import torch

import torchspmd as xs
from torchspmd.step import RebindingError
from torchspmd.step.places import MAX_DEPTH

DEVICE = xs.device()
CALLS = 4


def _nested(levels: int, leaf: dict) -> dict:
    """``leaf`` inside ``levels`` dicts: ``{"n": {"n": ... leaf}}`` (leaf at depth
    ``levels`` from the root)."""
    for _ in range(levels):
        leaf = {"n": leaf}
    return leaf


def _dig(root: dict, levels: int) -> dict:
    for _ in range(levels):
        root = root["n"]
    return root


def _decay_step(root: dict, levels: int, in_place: bool):
    """A step that decays the tensor ``h`` held ``levels`` dicts deep and adds ``x``: by
    rebinding the dict's slot, or in place."""

    def step(x):
        leaf = _dig(root, levels)
        if in_place:
            leaf["h"].mul_(0.5).add_(x)
        else:
            leaf["h"] = leaf["h"] * 0.5 + x
        return leaf["h"].sum()

    return step


def _matches_cpu_on_every_call(levels: int, in_place: bool) -> None:
    data = [torch.randn(3, generator=torch.Generator().manual_seed(i)) for i in range(CALLS)]
    cpu_root = _nested(levels, {"h": torch.ones(3)})
    root = _nested(levels, {"h": torch.ones(3).to(DEVICE)})
    cpu_step = _decay_step(cpu_root, levels, in_place)
    step = xs.compile(_decay_step(root, levels, in_place))
    replays = xs.metrics()["step_replays"]
    for x in data:
        torch.testing.assert_close(step(x.to(DEVICE)).cpu(), cpu_step(x))
        torch.testing.assert_close(_dig(root, levels)["h"].cpu(), _dig(cpu_root, levels)["h"])
    assert xs.metrics()["step_replays"] - replays == CALLS - 1


def test_a_new_tensor_put_at_the_walks_depth_limit_is_written_there_on_every_replay():
    _matches_cpu_on_every_call(MAX_DEPTH, in_place=False)


def test_a_new_tensor_put_beyond_the_walks_depth_limit_raises_at_capture_naming_its_path():
    root = _nested(MAX_DEPTH + 1, {"h": torch.ones(3).to(DEVICE)})
    step = xs.compile(_decay_step(root, MAX_DEPTH + 1, in_place=False))
    path = "closure variable 'root'" + "['n']" * (MAX_DEPTH + 1) + "['h']"
    with pytest.raises(RebindingError, match=r"(?s)" + path.replace("[", r"\[")
                       .replace("]", r"\]") + ".*6 levels.*copy_"):
        step(torch.ones(3).to(DEVICE))


def test_a_tensor_beyond_the_walks_depth_limit_updated_in_place_is_updated_on_every_replay():
    _matches_cpu_on_every_call(MAX_DEPTH + 1, in_place=True)


def _reads_h_after_it_is_replaced_outside(levels: int, refills: bool) -> None:
    cpu_root = _nested(levels, {"h": torch.ones(3)})
    root = _nested(levels, {"h": torch.ones(3).to(DEVICE)})
    if refills:
        cpu_step, step = _decay_step(cpu_root, levels, False), _decay_step(root, levels, False)
    else:
        def cpu_step(x):
            return (_dig(cpu_root, levels)["h"] * x).sum()

        def step(x):
            return (_dig(root, levels)["h"] * x).sum()
    step = xs.compile(step)
    x = torch.arange(3.0)
    for _ in range(2):
        torch.testing.assert_close(step(x.to(DEVICE)).cpu(), cpu_step(x))
    kept = _dig(root, levels)["h"]  # the old tensor stays alive: its storage is not dropped
    _dig(root, levels)["h"] = torch.full((3,), 5.0).to(DEVICE)
    _dig(cpu_root, levels)["h"] = torch.full((3,), 5.0)
    for _ in range(2):
        torch.testing.assert_close(step(x.to(DEVICE)).cpu(), cpu_step(x))
    assert kept is not _dig(root, levels)["h"]


def test_a_tensor_beyond_the_walks_depth_limit_replaced_outside_the_step_is_read_as_replaced():
    _reads_h_after_it_is_replaced_outside(MAX_DEPTH + 1, refills=False)


def test_a_tensor_the_step_refills_replaced_outside_the_step_is_read_as_replaced():
    _reads_h_after_it_is_replaced_outside(MAX_DEPTH, refills=True)


def test_a_gradient_of_a_tensor_beyond_the_walks_depth_limit_raises_at_capture():
    w = torch.ones(3, requires_grad=True).to(DEVICE).detach().requires_grad_()
    root = _nested(MAX_DEPTH + 1, {"w": w})

    @xs.compile
    def step(x):
        (_dig(root, MAX_DEPTH + 1)["w"] * x).sum().backward()

    with pytest.raises(RebindingError, match=r"\['w'\]\.grad"):
        step(torch.ones(3).to(DEVICE))


class _Decay(torch.nn.Module):
    """A module keeping a running tensor directly (``_state``) or in a private dict
    (``_cache['h']``)."""

    def __init__(self, device, in_dict: bool):
        super().__init__()
        self.in_dict = in_dict
        if in_dict:
            self._cache = {"h": torch.ones(3, device=device)}
        else:
            self._state = torch.ones(3, device=device)

    def forward(self, x):
        if self.in_dict:
            self._cache["h"] = self._cache["h"] * 0.5 + x
            return self._cache["h"].sum()
        self._state = self._state * 0.5 + x
        return self._state.sum()


def test_a_tensor_held_by_a_modules_underscore_attribute_is_written_there_on_every_replay():
    data = [torch.randn(3, generator=torch.Generator().manual_seed(i)) for i in range(CALLS)]
    cpu, module = _Decay("cpu", in_dict=False), _Decay(DEVICE, in_dict=False)
    step = xs.compile(lambda x: module(x))
    for x in data:
        torch.testing.assert_close(step(x.to(DEVICE)).cpu(), cpu(x))
        torch.testing.assert_close(module._state.cpu(), cpu._state)


def test_a_new_tensor_put_under_a_modules_underscore_attribute_raises_at_capture():
    module = _Decay(DEVICE, in_dict=True)
    step = xs.compile(lambda x: module(x))
    with pytest.raises(RebindingError, match=r"closure variable 'module'\._cache\['h'\]"):
        step(torch.ones(3).to(DEVICE))


@dataclasses.dataclass(slots=True)
class _Slotted:
    buffer: object = None


class _Mapping(collections.abc.MutableMapping):
    """A mapping that is no dict."""

    def __init__(self):
        self._items = {}

    def __getitem__(self, key):
        return self._items[key]

    def __setitem__(self, key, value):
        self._items[key] = value

    def __delitem__(self, key):
        del self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def _slotted_step(box: _Slotted):
    def step(x):
        if box.buffer is None:
            box.buffer = torch.zeros(3).to(DEVICE)
        box.buffer.add_(x)
        return box.buffer.sum()
    return step, lambda: box.buffer


def _deque_step(box: collections.deque):
    def step(x):
        if not box:
            box.append(torch.zeros(3).to(DEVICE))
        box[0].add_(x)
        return box[0].sum()
    return step, lambda: box[0]


def _mapping_step(box: _Mapping):
    def step(x):
        if "buffer" not in box:
            box["buffer"] = torch.zeros(3).to(DEVICE)
        box["buffer"].add_(x)
        return box["buffer"].sum()
    return step, lambda: box["buffer"]


@pytest.mark.parametrize("make", [lambda: _slotted_step(_Slotted()),
                                  lambda: _deque_step(collections.deque()),
                                  lambda: _mapping_step(_Mapping())],
                         ids=["__slots__ object", "deque", "mapping"])
def test_state_made_on_first_use_in_other_containers_is_updated_on_every_call(make):
    """Objects with ``__slots__``, deques and mappings that are no dict were not walked: a
    tensor the step made there stayed the capture's (sums 3, 3, 3, 3 instead of 3, 6, 9,
    12; a deque the step appends to kept one item)."""
    step, state = make()
    step = xs.compile(step)
    sums = [step(torch.ones(3).to(DEVICE)).item() for _ in range(CALLS)]
    assert sums == [3.0, 6.0, 9.0, 12.0]
    assert state().cpu().tolist() == [4.0] * 3


def test_a_deque_the_step_appends_to_gets_every_calls_item():
    history = collections.deque()

    @xs.compile
    def step(x):
        loss = (x * 2).sum()
        history.append(loss)
        return loss

    for i in range(CALLS):
        step(torch.ones(3).to(DEVICE) * i)
    assert [h.item() for h in history] == [0.0, 6.0, 12.0, 18.0]


def test_a_deque_at_its_maxlen_says_why_its_items_moved():
    """Appending to a full deque shifts every item to the slot before: a tensor moved
    between slots, which a replay cannot do; the refusal names the deque's shifting, and
    the refused call changed nothing (it kept its append and lost the oldest item)."""
    history = collections.deque(maxlen=2)
    w = torch.ones(3).to(xs.device())
    step = xs.compile(lambda x: history.append((w * x).sum()))
    for i in range(2):  # the deque fills up
        step(torch.full((3,), float(i)).to(xs.device()))
    with pytest.raises(RebindingError, match=r"deque\[0\] \(a deque at its maxlen shifts"):
        step(torch.full((3,), 2.0).to(xs.device()))
    assert [t.item() for t in history] == [0.0, 3.0]  # the refused call appended nothing
