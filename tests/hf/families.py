"""Tiny Hugging Face models of many families, built in code (no downloads), and their batches.

Every config is as small as the architecture allows (hidden 32, 2 layers, vocab 128,
sequence 8, batch 4) and has dropout off, so a CPU run and a device run of the same
weights compute the same function. ``Family.inputs(padded)`` returns the keyword
arguments of one training step, loss included (labels, or ``return_loss``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers as hf
from torch import nn

VOCAB, SEQ, BATCH, PAD = 128, 8, 4, 0
IMAGE, AUDIO = 32, 400  # image side (pixels), audio length (samples)

# Sizes shared by the text transformers (each config names them its own way below).
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, pad_token_id=PAD,
            bos_token_id=1, eos_token_id=2)
DECODER = dict(TEXT, num_key_value_heads=2)  # grouped-query attention where the family has it


@dataclass(frozen=True)
class Family:
    """One architecture: how to build it, and what one batch of it looks like.

    ``kind`` is the column of the docs' table; ``batch`` names the batch builder
    (``causal_lm``, ``masked_lm``, ``seq2seq``, ``image``, ...); ``masked`` says whether
    the model takes an attention mask, so it is also run with a padded batch.
    """

    name: str
    kind: str
    make: Callable[[], nn.Module]
    batch: str
    masked: bool = True

    def model(self) -> nn.Module:
        """The model with seeded weights, in eval mode (no dropout, whatever the config)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' notes on tiny configs
            torch.manual_seed(0)
            return self.make().eval()

    def inputs(self, padded: bool) -> dict[str, torch.Tensor]:
        """Keyword arguments of one step on the CPU, seeded; ``padded`` adds a padding mask."""
        gen = torch.Generator().manual_seed(1)
        return BATCHES[self.batch](gen, padded)


# ---------------------------------------------------------------- batches


def _padding_mask() -> torch.Tensor:
    """Row 0 padded on the left (3 tokens), row 1 on the right (2 tokens), rows 2-3 full."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, -2:] = 0
    return mask


def _ids(gen, padded: bool) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    if not padded:
        return {"input_ids": ids}
    mask = _padding_mask()
    return {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask}


def _labels_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The token ids as labels, -100 (ignored) on padding."""
    labels = batch["input_ids"].clone()
    if "attention_mask" in batch:
        labels[batch["attention_mask"] == 0] = -100
    return labels


def causal_lm(gen, padded):
    batch = _ids(gen, padded)
    return {**batch, "labels": _labels_of(batch)}


def masked_lm(gen, padded):
    batch = _ids(gen, padded)
    labels = _labels_of(batch)
    labels[:, ::2] = -100  # as a masked-LM collator: the loss on some tokens only
    return {**batch, "labels": labels}


def seq2seq(gen, padded):
    batch = _ids(gen, padded)
    target = _ids(gen, padded)
    return {**batch, "labels": _labels_of(target)}


def image(gen, padded):
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen),
            "labels": torch.randint(0, 3, (BATCH,), generator=gen)}


def audio_classes(gen, padded):
    batch = {"input_values": torch.randn(BATCH, AUDIO, generator=gen),
             "labels": torch.randint(0, 3, (BATCH,), generator=gen)}
    if padded:
        mask = torch.ones(BATCH, AUDIO, dtype=torch.long)
        mask[1, -AUDIO // 4:] = 0
        batch["input_values"] = batch["input_values"].masked_fill(mask == 0, 0.0)
        batch["attention_mask"] = mask
    return batch


def speech_to_text(gen, padded):
    target = _ids(gen, padded)
    return {"input_features": torch.randn(BATCH, 16, 2 * 16, generator=gen),
            "labels": _labels_of(target)}


def image_text(gen, padded):
    return {**_ids(gen, padded), "pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen),
            "return_loss": True}


BATCHES = {f.__name__: f for f in (causal_lm, masked_lm, seq2seq, image, audio_classes,
                                   speech_to_text, image_text)}


# ---------------------------------------------------------------- models


def _vision(**extra):
    return dict(image_size=IMAGE, num_channels=3, num_labels=3, **extra)


def _vit_like(config_cls, model_cls, **extra):
    return lambda: model_cls(config_cls(**_vision(
        patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra)))


def _bert_like(config_cls, model_cls, **extra):
    sizes = {k: v for k, v in TEXT.items() if k not in ("bos_token_id", "eos_token_id")}
    return lambda: model_cls(config_cls(**sizes, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, **extra))


def _decoder(config_cls, model_cls, **extra):
    return lambda: model_cls(config_cls(**{**DECODER, **extra}))


def _wav2vec2_like(config_cls, model_cls, **extra):
    """``extra`` overrides the sizes (positional-conv groups, feature-extractor norm)."""
    return lambda: model_cls(config_cls(**{**dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, num_labels=3,
        feat_extract_norm="layer", do_stable_layer_norm=True, mask_time_prob=0.0,
        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
        final_dropout=0.0, layerdrop=0.0, classifier_proj_size=16), **extra}))


def _text_vision(config_cls, model_cls, text_cls, vision_cls):
    text = text_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=64, pad_token_id=PAD,
                    bos_token_id=1, eos_token_id=2)
    vision = vision_cls(image_size=IMAGE, patch_size=8, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4)
    return lambda: model_cls(config_cls(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                        projection_dim=16))


FAMILIES = [
    # decoder-only
    Family("llama", "decoder", _decoder(hf.LlamaConfig, hf.LlamaForCausalLM), "causal_lm"),
    Family("mistral", "decoder", _decoder(hf.MistralConfig, hf.MistralForCausalLM, sliding_window=4),
           "causal_lm"),
    Family("qwen2", "decoder", _decoder(hf.Qwen2Config, hf.Qwen2ForCausalLM), "causal_lm"),
    Family("qwen3", "decoder", _decoder(hf.Qwen3Config, hf.Qwen3ForCausalLM, head_dim=8), "causal_lm"),
    Family("gemma", "decoder", _decoder(hf.GemmaConfig, hf.GemmaForCausalLM, head_dim=8), "causal_lm"),
    Family("gemma2", "decoder", _decoder(hf.Gemma2Config, hf.Gemma2ForCausalLM, head_dim=8,
                                         sliding_window=4), "causal_lm"),
    Family("phi3", "decoder", _decoder(hf.Phi3Config, hf.Phi3ForCausalLM), "causal_lm"),
    Family("gpt_neox", "decoder", _decoder(hf.GPTNeoXConfig, hf.GPTNeoXForCausalLM,
                                           rotary_pct=0.5), "causal_lm"),
    Family("opt", "decoder", lambda: hf.OPTForCausalLM(hf.OPTConfig(
        vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=1,
        eos_token_id=2, dropout=0.0, attention_dropout=0.0)), "causal_lm"),
    Family("gpt2", "decoder", lambda: hf.GPT2LMHeadModel(hf.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=1,
        eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)), "causal_lm"),
    Family("falcon", "decoder", lambda: hf.FalconForCausalLM(hf.FalconConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        new_decoder_architecture=True, num_kv_heads=2, pad_token_id=PAD, bos_token_id=1,
        eos_token_id=2)), "causal_lm"),
    Family("bloom", "decoder", lambda: hf.BloomForCausalLM(hf.BloomConfig(
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, pad_token_id=PAD, bos_token_id=1,
        eos_token_id=2)), "causal_lm"),
    # encoder-only
    Family("bert", "encoder", _bert_like(hf.BertConfig, hf.BertForMaskedLM), "masked_lm"),
    Family("roberta", "encoder", _bert_like(hf.RobertaConfig, hf.RobertaForMaskedLM), "masked_lm"),
    Family("distilbert", "encoder", lambda: hf.DistilBertForMaskedLM(hf.DistilBertConfig(
        vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64,
        pad_token_id=PAD, dropout=0.0, attention_dropout=0.0)), "masked_lm"),
    Family("albert", "encoder", _bert_like(hf.AlbertConfig, hf.AlbertForMaskedLM, embedding_size=16),
           "masked_lm"),
    Family("deberta_v2", "encoder", _bert_like(hf.DebertaV2Config, hf.DebertaV2ForMaskedLM,
                                               relative_attention=True, position_buckets=8,
                                               pos_att_type=["p2c", "c2p"]), "masked_lm"),
    # encoder-decoder
    Family("t5", "encoder-decoder", lambda: hf.T5ForConditionalGeneration(hf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=2,
        decoder_start_token_id=PAD)), "seq2seq"),
    Family("bart", "encoder-decoder", lambda: hf.BartForConditionalGeneration(hf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=PAD, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)), "seq2seq"),
    # vision
    Family("vit", "vision", _vit_like(hf.ViTConfig, hf.ViTForImageClassification), "image", masked=False),
    Family("resnet", "vision", lambda: hf.ResNetForImageClassification(hf.ResNetConfig(
        **_vision(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"))),
        "image", masked=False),
    Family("swin", "vision", lambda: hf.SwinForImageClassification(hf.SwinConfig(**_vision(
        patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0))),
        "image", masked=False),
    Family("convnext", "vision", lambda: hf.ConvNextForImageClassification(hf.ConvNextConfig(
        **_vision(num_stages=2, patch_size=4, hidden_sizes=[8, 16], depths=[1, 1], drop_path_rate=0.0))),
        "image", masked=False),
    # audio
    Family("wav2vec2", "audio", _wav2vec2_like(hf.Wav2Vec2Config, hf.Wav2Vec2ForSequenceClassification),
           "audio_classes"),
    # HuBERT with one positional-conv group (and group norm in its feature extractor): the
    # audio encoder, weight norm included, is checked while grouped convs fail (see the test).
    Family("hubert", "audio", _wav2vec2_like(hf.HubertConfig, hf.HubertForSequenceClassification,
                                             num_conv_pos_embedding_groups=1, feat_extract_norm="group",
                                             do_stable_layer_norm=False), "audio_classes"),
    Family("whisper", "audio", lambda: hf.WhisperForConditionalGeneration(hf.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=16, max_target_positions=64, pad_token_id=PAD, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0)), "speech_to_text", masked=False),
    # state space
    Family("mamba", "state-space", lambda: hf.MambaForCausalLM(hf.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4,
        pad_token_id=PAD, bos_token_id=1, eos_token_id=2, use_mambapy=False)), "causal_lm",
        masked=False),
    # mixture of experts
    Family("mixtral", "mixture-of-experts", _decoder(hf.MixtralConfig, hf.MixtralForCausalLM,
                                                     num_local_experts=4, num_experts_per_tok=2),
           "causal_lm"),
    Family("qwen2_moe", "mixture-of-experts", _decoder(
        hf.Qwen2MoeConfig, hf.Qwen2MoeForCausalLM, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32), "causal_lm"),
    # multimodal
    Family("clip", "multimodal", _text_vision(hf.CLIPConfig, hf.CLIPModel, hf.CLIPTextConfig,
                                              hf.CLIPVisionConfig), "image_text"),
]
