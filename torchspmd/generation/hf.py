"""Hugging Face ``generate`` on the spmd device: one program per prompt bucket, one to decode.

``generate``'s loop grows two tensors by a column every token (the token ids and the 2-D
attention mask) and reads a value every token (its stopping check). On the device each
token would be a graph of new shapes, so a new program. :func:`compile_generate` changes
where things run, on that model instance only, and none of ``generate``'s semantics:

- the loop's bookkeeping (ids, 2-D mask, logits processors, sampling, stopping criteria)
  runs on the host, where ``generate`` supports it (it moves the model's inputs to the
  model's device itself); only the model runs on the device, and its logits come back;
- with a static cache the model sees fixed shapes: the 2-D mask is padded to the cache's
  length (ones: the causal mask hides the future), the prompt is padded on the right to
  a bucket (:mod:`torchspmd.generation.buckets`), and the cache's length is rounded up;
- the decode step is a :func:`torchspmd.compile` step: captured once, then one replayed
  program per token; the prefill runs lazily, one program per bucket;
- while generating, ``nn.Linear`` layers run as one einsum each (``_einsum_linears``);
- with a dynamic cache (or a static one with sliding-window layers, ``static_cache.is_static``)
  the model runs lazily, and a :class:`RecompileWatch` counts each
  token's recompile and warns once, naming ``cache_implementation="static"``.

Example::

    model = LlamaForCausalLM(config).to(torchspmd.device())
    torchspmd.generation.compile_generate(model)
    out = model.generate(ids, max_new_tokens=256, cache_implementation="static")
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from torchspmd.device.tensor import SpmdTensor
from torchspmd.generation import greedy, static_cache
from torchspmd.generation.buckets import Buckets
from torchspmd.generation.recompiles import RecompileWatch
from torchspmd.parallel.linear import xla_patched_nn_linear_forward
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime import shape_changes
from torchspmd.step import HostReadInStep, compile as compile_step

# Recompiles of a dynamic-cache loop tolerated before the warning.
_WARN_AFTER = 3
_STATIC_REMEDY = ('Pass cache_implementation="static" to generate: it compiles one decode '
                  "program for all tokens")
_SLIDING_REMEDY = ("The static cache has sliding-window layers, whose positions Hugging Face "
                   "counts in a Python int that a compiled replay would not advance: they run "
                   "lazily, with correct values; a cache without sliding-window layers decodes "
                   "with one program")
_PADDED_BY_POSITION = ("position_ids", "decoder_position_ids")
_PADDED_BY_REPEAT = ("token_type_ids", "mm_token_type_ids")


@dataclass
class _Prompt:
    """The prompt of the ``generate`` call in progress: its length and its bucket."""

    length: int = 0
    bucket: int = 0


class HFGeneration:
    """The per-model adaptation installed by :func:`compile_generate` (``model._torchspmd_generation``)."""

    def __init__(self, model: torch.nn.Module, buckets: Buckets):
        self.model = model
        self.buckets = buckets
        self.original_generate = model.generate
        self.original_prepare = model.prepare_inputs_for_generation
        self.original_forward = model.forward
        self.original_static_cache = model._prepare_static_cache
        self.cache: Cache | None = None  # the static cache the decode step reads and writes
        self.prompt: _Prompt | None = None  # set while a generate call runs
        self.decode = compile_step(self._decode_step)
        self.greedy = greedy.GreedyLoop(self)
        # The model reads a value on the host in its decode forward (``if mask.any():``),
        # so its decode step cannot be one program: it runs lazily, token by token.
        self.reads_on_host = False
        self.watch = RecompileWatch(_WARN_AFTER, _STATIC_REMEDY)

    def install(self) -> None:
        """Route this model's ``generate`` through the adaptation (instance attributes only)."""
        model = self.model
        # Wrappers keep the originals' signatures: generate inspects them to check kwargs.
        model.generate = _wraps(self.generate, self.original_generate)
        model.prepare_inputs_for_generation = _wraps(self.prepare_inputs, self.original_prepare)
        model.create_masks_for_generate = self.masks_for_generate
        model._prepare_static_cache = _wraps(self.prepare_static_cache, self.original_static_cache)
        model.forward = _wraps(self.forward, self.original_forward)

    # -- the generate call: bookkeeping on the host --------------------------------------

    def generate(self, *args, **kwargs):
        """``model.generate`` with the loop's tensors on the host and the model on the device."""
        device = self.model.device
        if device.type != "spmd":
            return self.original_generate(*args, **kwargs)  # a model on another device
        on_device = [False]

        def to_host(t):
            if isinstance(t, SpmdTensor):
                on_device[0] = True
                return t.cpu()
            return t

        args, kwargs = tree_map(to_host, (args, kwargs))
        self.prompt, self.cache = _Prompt(), None
        ids = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
        if isinstance(ids, torch.Tensor) and ids.ndim == 2:
            # known before the cache is made, which must hold the padded prompt
            self.prompt.length = ids.shape[1]
            self.prompt.bucket = self.buckets.prompt(ids.shape[1])
        if greedy.may_take(self.model, args, kwargs):
            kwargs["custom_generate"] = self.greedy  # greedy: the loop runs on the device
        self.watch.start()
        try:
            with _einsum_linears(self.model):
                result = self.original_generate(*args, **kwargs)
        finally:
            self.prompt, self.cache = None, None
        if not on_device[0]:
            return result
        return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) and
                        t.device.type == "cpu" else t, result)

    def prepare_static_cache(self, cache_implementation: str, batch_size: int,
                             max_cache_len: int, *args, **kwargs) -> Cache:
        """HF's static cache, its length rounded up to a bucket (and long enough for the
        padded prompt)."""
        if self.prompt is not None:
            max_cache_len = self.buckets.cache(max(max_cache_len, self.prompt.bucket))
        return self.original_static_cache(cache_implementation, batch_size, max_cache_len,
                                          *args, **kwargs)

    def prepare_inputs(self, input_ids: torch.Tensor, next_sequence_length: int | None = None,
                       cache: Cache | None = None, **kwargs):
        """HF's ``prepare_inputs_for_generation``; a static cache's prefill padded to a bucket."""
        if self.prompt is not None and static_cache.is_static(cache) \
                and not cache.is_initialized and input_ids.device.type == "cpu":
            length = input_ids.shape[1] if next_sequence_length is None else next_sequence_length
            bucket = self.buckets.prompt(length)
            self.prompt.length, self.prompt.bucket = length, bucket
            input_ids = _pad_right(input_ids[:, -length:], bucket, _repeat_last)
            next_sequence_length = bucket
            for key in _PADDED_BY_POSITION + _PADDED_BY_REPEAT:
                if kwargs.get(key) is not None:
                    pad = _next_positions if key in _PADDED_BY_POSITION else _repeat_last
                    kwargs[key] = _pad_right(kwargs[key][..., -length:], bucket, pad)
        return self.original_prepare(input_ids, next_sequence_length=next_sequence_length,
                                     cache=cache, **kwargs)

    def masks_for_generate(self, config, inputs_embeds, attention_mask, cache=None, **kwargs):
        """In place of HF's 4-D mask made outside the model: the 2-D mask, padded with ones to
        the static cache's length, so the model makes its mask inside the compiled step
        from a tensor whose shape never changes."""
        if attention_mask is None or attention_mask.ndim != 2 \
                or not static_cache.is_static(cache):
            return attention_mask
        length = static_cache.length(cache)
        return F.pad(attention_mask, (0, length - attention_mask.shape[1]), value=1)

    # -- the model call: on the device ------------------------------------------------------

    def forward(self, *args, **kwargs):
        """The model's forward: prefill, compiled decode step, or (dynamic cache) lazily."""
        cache = kwargs.get("cache")
        if self.prompt is None or args:
            return self.original_forward(*args, **kwargs)
        if not static_cache.is_static(cache):
            return self._lazy(kwargs)  # shapes change every token: recompiles counted
        if not cache.is_initialized:
            return self._prefill(kwargs)
        if kwargs.get("output_attentions") or kwargs.get("output_hidden_states"):
            return self._lazy(kwargs)  # outputs the compiled decode step does not return
        return self._decode(kwargs)

    def _prefill(self, kwargs: dict):
        prompt = self.prompt
        device = self.model.device
        last = torch.tensor([prompt.length - 1]).to(device)  # data, not shape: one program per bucket
        keep = "logits_to_keep" in kwargs
        if keep:
            kwargs["logits_to_keep"] = last
        out = self.original_forward(**kwargs)
        for layer in kwargs["cache"].layers:
            # The padding's keys and values sit past the prompt, hidden by the causal mask
            # until decoding overwrites them: the cache holds the prompt's length.
            layer.cumulative_length.sub_(prompt.bucket - prompt.length)
        logits = out.logits if keep else out.logits.index_select(1, last)
        out.logits = logits.cpu()
        return out

    def _decode(self, kwargs: dict):
        if not self.reads_on_host:
            step = dict(kwargs)
            cache = step.pop("cache")
            self.cache = cache
            try:
                logits = self.decode(static_cache.tensors(cache), **step)
                return CausalLMOutputWithPast(logits=logits.cpu(), cache=cache)
            except HostReadInStep:  # the capture left every tensor as it was
                self.reads_on_host = True
        return self._lazy(kwargs)

    def _decode_step(self, state: list, **kwargs):
        # ``state`` holds the very tensors of ``self.cache``, which the model updates in place
        return self.original_forward(cache=self.cache, **kwargs).logits

    def _lazy(self, kwargs: dict):
        before = COUNTERS["graphs_compiled"]
        with shape_changes.watched():  # self.watch names the remedy for generate
            out = self.original_forward(**kwargs)
            out.logits = out.logits[:, -1:].cpu()
        shapes = {k: tuple(v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        cache = kwargs.get("cache")
        if isinstance(cache, Cache):
            shapes["cache"] = (int(cache.get_seq_length()),)
        self.watch.remedy = (_SLIDING_REMEDY if static_cache.has_sliding_layers(cache)
                             else _STATIC_REMEDY)
        self.watch.observe(shapes, COUNTERS["graphs_compiled"] - before)
        return out


def compile_generate(model: torch.nn.Module, prompt_lengths: tuple[int, ...] | None = None,
                     cache_multiple: int | None = None) -> torch.nn.Module:
    """Make ``model.generate`` compile a fixed number of programs on the spmd device.

    With ``cache_implementation="static"``: one prefill program per prompt-length bucket and
    one decode program, whatever ``max_new_tokens`` is; each token after the first is one
    replayed program. Prompts are padded on the right to the smallest of ``prompt_lengths``
    that holds them (default :data:`~torchspmd.generation.buckets.DEFAULT_PROMPT_LENGTHS`),
    and static caches are rounded up to a multiple of ``cache_multiple`` (default 64).
    With a dynamic cache, recompiles are counted in ``torchspmd.metrics()`` and warned
    about. Returns the model; calling it again replaces the buckets.

    Example::

        >>> torchspmd.generation.compile_generate(model, prompt_lengths=(16, 64))
        >>> model.generate(ids, max_new_tokens=64, cache_implementation="static")
    """
    if not hasattr(model, "generate") or not hasattr(model, "prepare_inputs_for_generation"):
        raise TypeError("torchspmd.generation.compile_generate: expected a Hugging Face model "
                        f"with generate(), got {type(model).__name__}")
    defaults = Buckets()
    buckets = Buckets(defaults.prompt_lengths if prompt_lengths is None else tuple(prompt_lengths),
                      defaults.cache_multiple if cache_multiple is None else cache_multiple)
    old = getattr(model, "_torchspmd_generation", None)
    if old is not None:
        for name in ("generate", "prepare_inputs_for_generation", "create_masks_for_generate",
                     "_prepare_static_cache", "forward"):
            model.__dict__.pop(name, None)
    adaptation = HFGeneration(model, buckets)
    adaptation.install()
    model._torchspmd_generation = adaptation
    return model


@contextlib.contextmanager
def _einsum_linears(model: torch.nn.Module):
    """Every ``nn.Linear`` of ``model`` computed as one einsum while generating.

    A decode step multiplies one row by each weight: ``F.linear`` reaches the device as
    ``x @ W.T``, for which XLA:CPU copies every weight transposed on every token (plain JAX
    does the same; 3.5x slower than a JAX loop on the 8-layer benchmark model), where the
    einsum contracts the weight's last dim in place. Instance attributes only, so hooks
    (tensor-parallel constraints), types and parameters stay as they are.
    """
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and
               "forward" not in m.__dict__]
    for m in linears:
        m.forward = functools.partial(xla_patched_nn_linear_forward, m)
    try:
        yield
    finally:
        for m in linears:
            del m.forward


def _wraps(method, original):
    """``method`` as a function with ``original``'s name, docstring and signature."""
    def call(*args, **kwargs):
        return method(*args, **kwargs)
    return functools.update_wrapper(call, original)


def _pad_right(t: torch.Tensor, length: int, fill) -> torch.Tensor:
    extra = length - t.shape[-1]
    return t if extra == 0 else torch.cat([t, fill(t, extra)], dim=-1)


def _repeat_last(t: torch.Tensor, n: int) -> torch.Tensor:
    return t[..., -1:].expand(*t.shape[:-1], n)


def _next_positions(t: torch.Tensor, n: int) -> torch.Tensor:
    return t[..., -1:] + torch.arange(1, n + 1, dtype=t.dtype)
