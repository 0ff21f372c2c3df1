"""Generation buckets: prompts pad to the smallest bucket holding them, caches round up."""

import pytest

from torchspmd.generation import Buckets


def test_prompt_pads_to_smallest_bucket_then_multiples_of_the_largest():
    b = Buckets(prompt_lengths=(4, 16), cache_multiple=64)
    assert [b.prompt(n) for n in (1, 4, 5, 16, 17, 33)] == [4, 4, 16, 16, 32, 48]


def test_cache_length_rounds_up_to_its_multiple():
    b = Buckets(cache_multiple=64)
    assert [b.cache(n) for n in (1, 64, 65, 263)] == [64, 64, 128, 320]


@pytest.mark.parametrize("lengths", [(), (8, 4), (0, 4), (4, 4), (2.5,)])
def test_bad_prompt_lengths_are_refused_by_name(lengths):
    with pytest.raises(ValueError, match="prompt_lengths must be"):
        Buckets(prompt_lengths=lengths)


def test_bad_cache_multiple_is_refused_by_name():
    with pytest.raises(ValueError, match="cache_multiple must be"):
        Buckets(cache_multiple=0)
