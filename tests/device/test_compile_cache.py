"""The compile cache is bounded (least recently used programs go first) and counts evictions."""

from __future__ import annotations

import pytest
import torch

import torchspmd
from torchspmd.runtime import execute
from torchspmd.runtime.cache import DEFAULT_PROGRAMS, programs_capacity_from_env

DEV = torchspmd.device()


@pytest.fixture
def small_cache():
    capacity = execute._PROGRAMS.capacity
    torchspmd.set_compile_cache_size(2)
    yield
    torchspmd.set_compile_cache_size(capacity)


def _step(n: int) -> None:
    (torch.ones(n).to(DEV) * 3).cpu()  # one distinct graph per n


def test_least_recently_used_programs_are_evicted_and_counted(small_cache):
    _step(101)
    _step(102)  # the cache now holds exactly these two
    before = torchspmd.metrics()
    _step(101)  # used again, so 102 is the least recently used
    _step(103)
    after = torchspmd.metrics()
    assert after["programs_evicted"] - before["programs_evicted"] == 1
    assert execute.compiled_programs() == 2
    compiled = after["graphs_compiled"]
    _step(101)
    assert torchspmd.metrics()["graphs_compiled"] == compiled  # still cached
    _step(102)
    assert torchspmd.metrics()["graphs_compiled"] == compiled + 1  # compiled again


def test_capacity_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("TORCHSPMD_COMPILE_CACHE_SIZE", raising=False)
    assert programs_capacity_from_env() == DEFAULT_PROGRAMS
    monkeypatch.setenv("TORCHSPMD_COMPILE_CACHE_SIZE", "17")
    assert programs_capacity_from_env() == 17
    monkeypatch.setenv("TORCHSPMD_COMPILE_CACHE_SIZE", "lots")
    with pytest.raises(ValueError, match="TORCHSPMD_COMPILE_CACHE_SIZE=.* must be an int >= 1"):
        programs_capacity_from_env()


def test_a_capacity_below_one_is_refused():
    with pytest.raises(ValueError, match="a cache capacity must be an int >= 1, got 0"):
        torchspmd.set_compile_cache_size(0)


def test_compile_cpu_time_is_counted_for_compiles_only():
    before = torchspmd.metrics()["compile_cpu_s"]
    _step(131)  # a new graph: traced and compiled
    compiled = torchspmd.metrics()["compile_cpu_s"]
    assert compiled > before
    _step(131)  # the same graph again: a cache hit adds nothing
    assert torchspmd.metrics()["compile_cpu_s"] == compiled
