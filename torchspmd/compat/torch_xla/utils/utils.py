"""``torch_xla.utils.utils``: ``SampleGenerator``, the fake-data iterable examples use."""

from __future__ import annotations

from typing import Any


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
