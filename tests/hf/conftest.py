"""Tiny Llama and GPT-2 on the device with ``compile_generate``, and their CPU twins, built
once per module that asks for them (the generation tests)."""

import pytest

from tests.hf.models import on_device, tiny_gpt2, tiny_llama


@pytest.fixture(scope="module")
def llama():
    return on_device(tiny_llama)


@pytest.fixture(scope="module")
def gpt2():
    return on_device(tiny_gpt2)
