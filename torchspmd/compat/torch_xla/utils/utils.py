"""``torch_xla.utils.utils``: the helpers scripts use: fake data (``SampleGenerator``,
``FnDataGenerator``) and environment flags (``getenv_as``, ``check_env_flag``)."""

from __future__ import annotations

import os
from typing import Any, Callable


class SampleGenerator:
    """Yields ``data`` ``sample_count`` times (fake data for benchmarks).

    Example: ``for x, y in SampleGenerator((x, y), 10): ...``
    """

    def __init__(self, data: Any, sample_count: int):
        self._data = data
        self._sample_count = sample_count

    def __len__(self) -> int:
        return self._sample_count

    def __iter__(self):
        for _ in range(self._sample_count):
            yield self._data


class FnDataGenerator:
    """Yields ``count`` batches ``(data, func(data))`` with ``data = gen_tensor(batch_size,
    *dims)`` (fake data for benchmarks).

    Example: ``for x, y in FnDataGenerator(lambda x: x.sum(1), 8, torch.randn, (4,), 10): ...``
    """

    def __init__(self, func: Callable, batch_size: int, gen_tensor: Callable,
                 dims: Any = None, count: int = 1):
        self._func, self._batch_size, self._gen_tensor = func, batch_size, gen_tensor
        self._dims = list(dims) if dims else [1]
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        for _ in range(self._count):
            data = self._gen_tensor(self._batch_size, *self._dims)
            yield data, self._func(data)


def getenv_as(name: str, type: type, defval: Any = None) -> Any:
    """The environment variable ``name`` converted by ``type`` (``bool`` reads it as an
    int: ``"0"`` is False), or ``defval`` when it is not set.

    Example: ``steps = getenv_as("STEPS", int, 100)``.
    """
    value = os.environ.get(name)
    if value is None:
        return defval
    return bool(int(value)) if type is bool else type(value)


def check_env_flag(name: str, default: str = "") -> bool:
    """Whether the environment variable ``name`` is ``"true"`` or a positive integer.

    Example: ``if check_env_flag("DEBUG"): ...``.
    """
    flag = os.getenv(name, default)
    return flag == "true" or (flag.isdigit() and int(flag) > 0)
