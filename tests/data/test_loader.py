"""ShardedLoader / send_cpu_data_to_device (spec §1.7): sharded uploads, prefetch, errors."""

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.data import ShardedLoader, send_cpu_data_to_device
from torchspmd.sharding import Mesh, ShardingSpec, XLAShardedTensor, get_sharding

N = 8
ALL = ",".join(str(i) for i in range(N))


def mesh_1d() -> Mesh:
    return Mesh(np.arange(N), (N,), ("data",))


def batch_spec(mesh: Mesh | None = None, minibatch: bool = False) -> ShardingSpec:
    return ShardingSpec(mesh or mesh_1d(), ("data", None), minibatch=minibatch)


def batches(count=3, rows=16):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(rows, 4, generator=gen), torch.randint(0, 9, (rows, 4), generator=gen))
            for _ in range(count)]


def bytes_sent() -> int:
    return torchspmd.metrics()["bytes_to_device"]


class CountingSource:
    """An iterable that counts how many batches were taken from it."""

    def __init__(self, items):
        self.items, self.taken = items, 0

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        for item in self.items:
            self.taken += 1
            yield item


# --- what arrives ----------------------------------------------------------------------

def test_batches_arrive_sharded_on_the_batch_dim():
    for x, y in ShardedLoader(batches(), "spmd", input_sharding=batch_spec()):
        assert get_sharding(x) == get_sharding(y) == f"{{devices=[8,1]{ALL}}}"


def test_batches_keep_their_values():
    loaded = list(ShardedLoader(batches(), "spmd", input_sharding=batch_spec()))
    for (x, y), (cx, cy) in zip(loaded, batches()):
        assert torch.equal(x.cpu(), cx) and torch.equal(y.cpu(), cy)


def test_each_device_receives_only_its_shard():
    x = torch.randn(16, 4)
    before = bytes_sent()
    send_cpu_data_to_device(x, "spmd", batch_spec())
    assert bytes_sent() - before == x.nbytes  # 8 shards of 1/8, nothing replicated


def test_partially_replicated_spec_sends_one_copy_per_replica():
    mesh = Mesh(np.arange(N), (4, 2), ("data", "model"))
    x = torch.randn(16, 4)
    before = bytes_sent()
    send_cpu_data_to_device(x, "spmd", batch_spec(mesh))
    assert bytes_sent() - before == 2 * x.nbytes  # each quarter on the 2 'model' devices


def test_upload_happens_before_the_step_runs():
    x = send_cpu_data_to_device(torch.randn(16, 4), "spmd", batch_spec())
    assert x.handle.value()[0].arrays is not None  # device data already, not host data


def test_no_spec_means_replicated():
    x = send_cpu_data_to_device(torch.randn(16, 4), "spmd")
    assert get_sharding(x) == "{replicated}"


def test_tensor_of_another_rank_is_replicated():
    x, labels = send_cpu_data_to_device((torch.randn(16, 4), torch.arange(16)), "spmd", batch_spec())
    assert get_sharding(x) == f"{{devices=[8,1]{ALL}}}"
    assert get_sharding(labels) == "{replicated}"


def test_nested_batches_keep_their_structure():
    out = send_cpu_data_to_device({"a": [torch.zeros(8, 2)], "b": 3}, "spmd", batch_spec())
    assert out["b"] == 3 and out["a"][0].device.type == "spmd"


def test_a_hugging_face_batch_encoding_stays_one_with_its_tensors_sharded():
    """A tokenizer's or collator's ``BatchEncoding`` (a ``UserDict``, which PyTorch's
    pytree leaves whole) was handed on with CPU tensors; the caller's batch is unchanged."""
    from transformers import BatchEncoding

    ids = torch.arange(64).reshape(16, 4)
    batch = BatchEncoding({"input_ids": ids, "attention_mask": torch.ones(16, 4)})
    for spec in (batch_spec(), {"input_ids": batch_spec(), "attention_mask": batch_spec()}):
        [out] = ShardedLoader([batch], input_sharding=spec)
        assert type(out) is BatchEncoding and list(out) == ["input_ids", "attention_mask"]
        assert get_sharding(out.input_ids) == f"{{devices=[{N},1]{ALL}}}"
        assert torch.equal(out["input_ids"].cpu(), ids)
        assert batch["input_ids"].device.type == "cpu"


def test_a_dataclass_batch_keeps_its_type_with_its_tensors_sharded():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Batch:
        x: torch.Tensor
        labels: list
        weight: float = 1.0

    [out] = ShardedLoader([Batch(torch.ones(16, 4), [torch.zeros(16, 2)], 0.5)],
                          input_sharding=batch_spec())
    assert type(out) is Batch and out.weight == 0.5
    assert get_sharding(out.x) == get_sharding(out.labels[0]) == f"{{devices=[{N},1]{ALL}}}"


def test_dict_spec_shards_each_key_its_own_way():
    mesh = Mesh(np.arange(N), (4, 2), ("data", "model"))
    spec = {"x": ShardingSpec(mesh, ("data", None)), "y": ShardingSpec(mesh, (None, "model"))}
    out = send_cpu_data_to_device({"x": torch.randn(8, 4), "y": torch.randn(8, 4)}, "spmd", spec)
    assert get_sharding(out["x"]) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert get_sharding(out["y"]) == "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"


def test_uneven_batch_is_padded_not_rejected():
    x = send_cpu_data_to_device(torch.arange(7.).reshape(7, 1), "spmd", batch_spec())
    assert get_sharding(x) == f"{{devices=[8,1]{ALL}}}"
    assert torch.equal(x.cpu(), torch.arange(7.).reshape(7, 1))


def test_sub_mesh_batches_live_on_the_sub_mesh():
    sub = Mesh([4, 5, 6, 7], (4,), ("data",))
    x = send_cpu_data_to_device(torch.randn(8, 4), "spmd", batch_spec(sub))
    assert get_sharding(x) == "{devices=[4,1]4,5,6,7}"
    assert {s.shard_device for s in XLAShardedTensor(x).local_shards} == {
        f"CPU:{i}" for i in (4, 5, 6, 7)}


# --- errors ----------------------------------------------------------------------------

def test_dict_spec_with_non_dict_batch_raises():
    loader = ShardedLoader(batches(), "spmd", input_sharding={"x": batch_spec()})
    with pytest.raises(ValueError, match="input batch should be a dict when input sharding is a dict."):
        next(iter(loader))


def test_missing_keys_raise_key_error():
    loader = ShardedLoader([{"x": torch.zeros(8, 2), "y": torch.zeros(8, 2), "z": torch.zeros(8)}],
                           "spmd", input_sharding={"x": batch_spec()})
    with pytest.raises(KeyError, match=r"Keys: \['y', 'z'\] are missing from input_sharding."):
        next(iter(loader))


def test_minibatch_requires_a_divisible_batch():
    loader = ShardedLoader(batches(rows=N - 1), "spmd", input_sharding=batch_spec(minibatch=True))
    with pytest.raises(RuntimeError, match="When minibatch is configured, the per-host batch size "
                                           "must be divisible by local runtime device count. "
                                           "Per host input data shape"):
        next(iter(loader))


def test_minibatch_with_a_divisible_batch_is_sharded():
    (x, _), = list(ShardedLoader(batches(1), "spmd", input_sharding=batch_spec(minibatch=True)))
    assert get_sharding(x) == f"{{devices=[8,1]{ALL}}}"


def test_a_bad_look_ahead_batch_fails_only_when_reached():
    good, bad = {"x": torch.zeros(8, 2)}, {"x": torch.zeros(8, 2), "y": torch.zeros(8, 2)}
    it = iter(ShardedLoader([good, bad], "spmd", input_sharding={"x": batch_spec()}))
    assert next(it)["x"].device.type == "spmd"
    with pytest.raises(KeyError):
        next(it)


def test_negative_prefetch_is_rejected():
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        ShardedLoader([], "spmd", prefetch=-1)


# --- prefetch --------------------------------------------------------------------------

def test_next_batch_is_sent_while_the_current_one_is_used():
    source = CountingSource(batches(4))
    it = iter(ShardedLoader(source, "spmd", input_sharding=batch_spec()))
    before = bytes_sent()
    next(it)
    assert source.taken == 2
    assert bytes_sent() - before == 2 * sum(t.nbytes for t in batches(1)[0])


def test_prefetch_zero_sends_on_demand():
    source = CountingSource(batches(4))
    it = iter(ShardedLoader(source, "spmd", input_sharding=batch_spec(), prefetch=0))
    next(it)
    assert source.taken == 1


def test_every_batch_is_yielded_once_in_order():
    loaded = list(ShardedLoader(batches(5), "spmd", input_sharding=batch_spec(), prefetch=2))
    assert [torch.equal(x.cpu(), cx) for (x, _), (cx, _) in zip(loaded, batches(5))] == [True] * 5
    assert len(loaded) == 5


def test_len_is_the_source_length():
    assert len(ShardedLoader(batches(5), "spmd")) == 5


def test_training_on_loaded_batches_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 1)
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(cpu.state_dict())
    model.to("spmd")
    data = [(x, y[:, :1].float()) for x, y in batches(3)]
    losses = {"spmd": [], "cpu": []}
    for name, net, source in (("spmd", model, ShardedLoader(data, "spmd", input_sharding=batch_spec())),
                              ("cpu", cpu, data)):
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for x, y in source:
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            torchspmd.sync()
            losses[name].append(loss.item())
    np.testing.assert_allclose(losses["spmd"], losses["cpu"], rtol=1e-5)


def test_the_loader_and_checkpoints_are_reachable_after_a_plain_import():
    """``torchspmd.data.ShardedLoader`` (the migration table's name) without importing
    ``torchspmd.data`` first: loaded on first use."""
    import subprocess
    import sys

    code = "import torchspmd; print(torchspmd.data.ShardedLoader.__name__, torchspmd.checkpoint.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["ShardedLoader", "torchspmd.checkpoint"], out.stderr[-2000:]
