"""Greedy decoding with the loop on the device: one launch for all the tokens after the
first, no host round trip, no ``generate`` Python per token.

``generate``'s own loop does a few milliseconds of Python per token (preparing inputs,
growing the ids and the mask, stopping criteria) and reads every token back before it can
make the next; a compiled step per token still costs the host a launch per token (~0.2 ms,
a small model's whole token). For the common case, greedy decoding with a static cache and
no logits processors, :class:`GreedyLoop` runs the tokens after the first as one compiled
step holding a loop on the device (``device_loop.DeviceLoop``): each iteration runs the
model and picks the token (the argmax, the end-of-sequence bookkeeping, the next ids and
positions, the token's column in a buffer), and the loop stops on the device once every
sequence has finished or the tokens asked for are made. The host launches it once and
reads the tokens once, at the end.

The tokens are ``generate``'s, token for token: the same prefill and first token (run by
``generate``'s own code), then the same argmax of the same logits, the same padding of
finished rows (``next * unfinished + pad * (1 - unfinished)``) and the same stop (the
first step after which every row has finished, or ``max_length``). An index out of range
inside the loop (positions past a model's table) raises ``IndexError`` naming the op,
as everywhere (``index_checks.fold``).

Any other call (sampling, beam search, logits processors, stop strings, streamers, a
cache the caller keeps, ``return_dict_in_generate``) runs ``generate``'s own method.

Example::

    loop = GreedyLoop(adaptation)      # hf.HFGeneration, once per model
    ids = loop(model, input_ids, logits_processor=..., stopping_criteria=...,
               generation_config=..., **model_kwargs)    # generate's custom_generate
"""

from __future__ import annotations

from dataclasses import dataclass

from jax.tree_util import tree_flatten, tree_unflatten
import torch
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.logits_process import (MinLengthLogitsProcessor,
                                                     MinNewTokensLengthLogitsProcessor)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GENERATION_MODES_MAPPING

from torchspmd.device import index_checks
from torchspmd.generation import static_cache
from torchspmd.generation.device_loop import DeviceLoop
from torchspmd.interop.jax_op import record_op
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.step import HostReadInStep, compile as compile_step

# ``generate`` arguments under which it may hand the loop to :class:`GreedyLoop`; any
# other (a streamer, an assistant, stop strings, output dicts) keeps its own loop.
_DECIDED_LATER = {"generation_config", "max_new_tokens", "max_length", "min_new_tokens",
                  "min_length", "cache_implementation",
                  "do_sample", "num_beams", "attention_mask", "eos_token_id", "pad_token_id",
                  "use_cache", "input_ids", "inputs"}
# The inputs a decoder's decode step gets from ``prepare_inputs_for_generation`` that the
# loop knows how to advance (or that stay as they are).
_DECODE_INPUTS = {"input_ids", "position_ids", "attention_mask", "cache", "logits_to_keep",
                  "use_cache"}


def may_take(model, args: tuple, kwargs: dict) -> bool:
    """Whether a ``generate(*args, **kwargs)`` call could be greedy decoding that the loop
    runs (the final decision, on the merged config, is :meth:`GreedyLoop.__call__`'s)."""
    if len(args) > 1 or any(key not in _DECIDED_LATER for key, v in kwargs.items()
                             if v is not None):  # None: the argument's default
        return False
    if kwargs.get("do_sample") or (kwargs.get("num_beams") or 1) != 1:
        return False
    config = kwargs.get("generation_config") or model.generation_config
    # (the config's mode: e.g. contrastive search, run by a Hub repository, stays generate's)
    return config.get_generation_mode() is GenerationMode.GREEDY_SEARCH


class GreedyLoop:
    """``generate``'s ``custom_generate``: greedy decoding on the device (module docstring),
    every other case handed back to ``generate``'s own method.

    Example (what ``compile_generate`` sets up; ``generate`` then calls it)::

        loop = GreedyLoop(model._torchspmd_generation)
        model.generate(ids, max_new_tokens=64, custom_generate=loop,
                       cache_implementation="static")
    """

    def __init__(self, adaptation):
        self.adaptation = adaptation  # hf.HFGeneration: its cache, prompt and forward
        self.step = compile_step(self._step)

    def __call__(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                 **model_kwargs):
        mode = generation_config.get_generation_mode()
        if not self._takes(mode, logits_processor, stopping_criteria, generation_config,
                           model_kwargs):
            method = getattr(type(model), GENERATION_MODES_MAPPING[mode])
            return method(model, input_ids, logits_processor=logits_processor,
                          stopping_criteria=stopping_criteria,
                          generation_config=generation_config, **model_kwargs)
        COUNTERS["generate_device_loops"] += 1
        eos = next((c.eos_token_id for c in stopping_criteria
                    if isinstance(c, EosTokenCriteria)), None)
        pad = generation_config._pad_token_tensor
        batch = input_ids.shape[0]
        unfinished = torch.ones(batch, dtype=torch.long)

        # The prefill and the first token exactly as ``generate``'s ``_sample``.
        outputs = model._prefill(input_ids, generation_config, model_kwargs)
        model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
        input_ids, unfinished = _next_token(input_ids, outputs.logits, logits_processor,
                                            stopping_criteria, eos, pad, unfinished)
        left = _max_length(stopping_criteria) - input_ids.shape[1]
        if unfinished.max() == 0 or left <= 0:
            return input_ids

        inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1,
                                                     **model_kwargs)
        made = None
        if not self.adaptation.reads_on_host and self._advances(inputs):
            ban = MinimumLength.of(logits_processor, input_ids.shape[1])
            try:
                made = self._decode(inputs, eos, pad, ban, unfinished, left)
            except HostReadInStep:
                # The model reads a value on the host in its forward: it cannot be one
                # program. The capture left every tensor as it was (the host loop below
                # runs outside this handler, so the error's frames are gone by then).
                self.adaptation.reads_on_host = True
        if made is None:
            return _host_loop(model, input_ids, inputs, model_kwargs, logits_processor,
                              stopping_criteria, eos, pad, unfinished)
        return torch.cat([input_ids, _until_finished(made, unfinished, eos)], dim=-1)

    # -- which calls -------------------------------------------------------------------------

    def _takes(self, mode, logits_processor, stopping_criteria, generation_config,
               model_kwargs) -> bool:
        adaptation = self.adaptation
        if mode is not GenerationMode.GREEDY_SEARCH or not MinimumLength.handles(logits_processor):
            return False
        if any(type(c) not in (MaxLengthCriteria, EosTokenCriteria) for c in stopping_criteria):
            return False
        if _max_length(stopping_criteria) is None or adaptation.prompt is None:
            return False
        if generation_config.return_dict_in_generate or adaptation.model.config.is_encoder_decoder:
            return False
        cache = model_kwargs.get("cache")
        if not static_cache.is_static(cache) or getattr(cache, "_is_user_defined", False):
            return False
        tensors = {k for k, v in model_kwargs.items() if isinstance(v, torch.Tensor)}
        return tensors <= {"attention_mask", "position_ids"}

    def _advances(self, inputs: dict) -> bool:
        """Whether the loop can advance these decode inputs itself: only the ids and the
        positions change per token (the 2-D mask is padded to the cache's length)."""
        if set(inputs) - _DECODE_INPUTS:
            return False
        mask = inputs.get("attention_mask")
        length = static_cache.length(inputs["cache"])
        return mask is None or (mask.ndim == 2 and mask.shape[1] == length)

    # -- the tokens after the first --------------------------------------------------------

    def _decode(self, inputs: dict, eos, pad, ban: "MinimumLength | None", unfinished: torch.Tensor,
                left: int) -> torch.Tensor:
        """Run up to ``left`` tokens (fewer when every row finishes) in one launch; the
        tokens they made, on the host, one column per token."""
        device = self.adaptation.model.device
        inputs = dict(inputs)  # the host loop takes them as they are if this one fails
        cache = inputs.pop("cache")
        length = static_cache.length(cache)
        self.adaptation.cache = cache
        state = static_cache.tensors(cache)
        ids = inputs.pop("input_ids").to(device)
        positions = inputs.pop("position_ids", None)
        positions = positions.to(device) if positions is not None else None
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        flags = unfinished.clone().to(device)
        made = torch.zeros(ids.shape[0], length, dtype=torch.long).to(device)
        index = torch.zeros(1, dtype=torch.long).to(device)
        ends = (eos.reshape(-1).to(device), pad.reshape(1).to(device)) if eos is not None else None
        # Data, not constants of the program: one program for any prompt, minimum length
        # and number of tokens.
        bans = None if ban is None else tuple(torch.tensor(v).to(device) for v in ban.tensors())
        count = torch.tensor(left).to(device)
        self.step(state, ids, positions, flags, made, index, ends, bans, count, **inputs)
        run = int(index.cpu())
        COUNTERS["generate_device_tokens"] += run
        return made.cpu()[:, :run]  # read whole: a slice of each length would be a program

    def _step(self, state: list, ids, positions, flags, made, index, ends, bans, count,
              **inputs):
        """The compiled step: up to ``count`` tokens in one ``DeviceLoop``, which stops
        early once every row's flag is 0. ``state`` holds the very tensors of the
        adaptation's cache; every carried tensor is updated in place."""
        # The loop's inputs as flat lists (JAX's pytrees: a ``None``, an absent
        # ``positions`` or ``bans``, holds no tensor): what it updates, then what it reads.
        carried, carried_spec = tree_flatten((state, ids, flags, made, index, positions))
        tensor_inputs = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        read_only, read_spec = tree_flatten((ends, bans, tensor_inputs))
        cache = self.adaptation.cache

        def one_token(*tensors):
            own_state, *own = tree_unflatten(carried_spec, tensors[:len(carried)])
            own_ends, own_bans, own_inputs = tree_unflatten(read_spec, tensors[len(carried):])
            own_ids, own_flags, own_made, own_index, own_positions = own
            outside = static_cache.swap(cache, own_state)
            try:
                self._token(own_ids, own_positions, own_flags, own_made, own_index, own_ends,
                            own_bans, **{**inputs, **own_inputs})
                own_state = static_cache.tensors(cache)  # (the model may rebind them)
            finally:
                static_cache.swap(cache, outside)
            return tree_flatten((own_state, *own))[0]

        flags_at = len(state) + 1 if ends is not None else None  # after the cache and the ids
        loop, constants, checks = DeviceLoop.of(one_token, carried, read_only, flags_at)
        values = record_op(loop, [count, *carried, *read_only, *constants])
        if checks:
            index_checks.fold(values.pop(), checks)
        for tensor, value in zip(carried, values):
            tensor.copy_(value)

    def _token(self, ids, positions, flags, made, index, ends, bans, **inputs):
        """One token, as the loop's body: the model on the current ids, the argmax, the
        end-of-sequence bookkeeping, the token into ``made``; all in place."""
        logits = self.adaptation.original_forward(cache=self.adaptation.cache, input_ids=ids,
                                                  position_ids=positions, **inputs).logits
        scores = logits[:, -1].float()
        if bans is not None:  # MinimumLength: the banned tokens' scores are -inf while short
            length, until, banned = bans
            vocab = torch.arange(scores.shape[-1], device=scores.device)
            hit = (vocab[:, None] == banned[None, :]).any(dim=-1)
            scores = torch.where(hit & ((length + index) < until), float("-inf"), scores)
        tokens = torch.argmax(scores, dim=-1)
        if ends is not None:
            eos, pad = ends
            tokens = tokens * flags + pad * (1 - flags)
            flags.mul_((tokens[:, None] != eos[None, :]).all(dim=-1).long())
        ids.copy_(tokens[:, None])
        if positions is not None:
            positions.add_(1)
        made.index_copy_(1, index, tokens[:, None])
        index.add_(1)


@dataclass(frozen=True)
class MinimumLength:
    """``generate``'s minimum-length processors as one rule the step applies on the device:
    while the ids are shorter than ``until``, the ``banned`` tokens (end-of-sequence) score
    -inf. ``length``: the ids' length before the loop's first step.

    Example::

        >>> from transformers.generation.logits_process import MinLengthLogitsProcessor
        >>> MinimumLength.of([MinLengthLogitsProcessor(12, eos_token_id=2)], 6)
        MinimumLength(length=6, until=12, banned=(2,))
    """

    length: int
    until: int
    banned: tuple[int, ...]

    @staticmethod
    def handles(processors) -> bool:
        """Whether the loop applies every processor of ``processors``: these two, whose
        rule depends on the ids' length only, all banning the same tokens."""
        return (all(type(p) in (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)
                    for p in processors)
                and len({_ids(p.eos_token_id) for p in processors}) <= 1)

    @staticmethod
    def of(processors, length: int) -> "MinimumLength | None":
        """The rule of ``processors`` (which :meth:`handles`) from ids of ``length`` on;
        None when they ban nothing any more."""
        until = max((p.min_length if isinstance(p, MinLengthLogitsProcessor)
                     else p.prompt_length_to_skip + p.min_new_tokens for p in processors),
                    default=0)
        if until <= length:
            return None
        return MinimumLength(length, until, _ids(processors[0].eos_token_id))

    def tensors(self) -> tuple:
        return self.length, self.until, list(self.banned)


def _ids(token_ids) -> tuple[int, ...]:
    return tuple(torch.as_tensor(token_ids).reshape(-1).tolist())


def _next_token(input_ids, logits, logits_processor, stopping_criteria, eos, pad,
                unfinished) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of ``generate``'s greedy loop on the host, from the model's logits: the
    argmax of the processed last scores, finished rows padded, the ids grown by a column;
    the new ids and the rows the stopping criteria leave unfinished."""
    scores = logits_processor(input_ids, logits[:, -1].to(copy=True, dtype=torch.float32))
    tokens = torch.argmax(scores, dim=-1)
    if eos is not None:
        tokens = tokens * unfinished + pad * (1 - unfinished)
    input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
    return input_ids, unfinished & ~stopping_criteria(input_ids, None)


def _max_length(stopping_criteria) -> int | None:
    lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
    return min(lengths) if lengths else None


def _until_finished(made: torch.Tensor, unfinished: torch.Tensor, eos) -> torch.Tensor:
    """The columns of ``made`` up to the step after which every row had finished (all of
    them if some row never finishes), as ``generate`` stops."""
    if eos is None:
        return made
    unfinished = unfinished.clone()
    for t in range(made.shape[1]):
        unfinished &= ~torch.isin(made[:, t], eos)
        if unfinished.max() == 0:
            return made[:, :t + 1]
    return made


def _host_loop(model, input_ids, inputs, model_kwargs, logits_processor, stopping_criteria,
               eos, pad, unfinished) -> torch.Tensor:
    """``generate``'s own loop for the calls :class:`GreedyLoop` takes, one token per host
    round trip, from the first decode step's ``inputs`` on: for decode inputs the device
    loop cannot advance (a model whose inputs change otherwise per token)."""
    while True:
        outputs = model(**inputs, return_dict=True)
        model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
        input_ids, unfinished = _next_token(input_ids, outputs.logits, logits_processor,
                                            stopping_criteria, eos, pad, unfinished)
        if unfinished.max() == 0:
            return input_ids
        inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1,
                                                     **model_kwargs)
