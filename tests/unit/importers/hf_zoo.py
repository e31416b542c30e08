"""Shared by the transformers tests: models built from `transformers` configs (random weights, no
downloads, 2 layers, hidden 128), their inputs as keyword arguments, and the dims that may vary.

`build(name)` returns (model, inputs(batch, seq) -> kwargs, dynamic(batch, seq) -> dynamic_shapes
spec by keyword, output(result) -> tensor). Text models take a padding mask with a padded row, so
masks are exercised, never all ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

transformers = None


def _tf():
    global transformers
    if transformers is None:
        import transformers as tf
        transformers = tf
    return transformers


VOCAB = 1000
SMALL = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256)


@dataclass
class HFModel:
    name: str
    model: torch.nn.Module
    inputs: Callable[[int, int], dict]      # (batch, seq) -> keyword inputs, fresh random values
    text: bool                              # a sequence dim that may vary
    sizes: tuple = ((2, 16), (3, 24))       # (batch, seq) pairs the tests run

    def dynamic(self, batch: bool = True, seq: bool = True) -> dict:
        """`dynamic_shapes` by keyword: dim 0 of every input is the batch, dim 1 of a text
        model's inputs the sequence."""
        from torch.export import Dim
        b, s = Dim("batch", min=1, max=64), Dim("seq", min=2, max=64)
        spec = {}
        for key in self.inputs(2, 16):
            axes = {}
            if batch:
                axes[0] = b
            if seq and self.text:
                axes[1] = s
            spec[key] = axes or None
        return spec


def output(result: Any) -> torch.Tensor:
    """The tensor a test compares: logits, else the last hidden state."""
    if isinstance(result, torch.Tensor):
        return result
    for key in ("logits", "last_hidden_state"):
        v = getattr(result, key, None) if not isinstance(result, dict) else result.get(key)
        if v is not None:
            return v
    if isinstance(result, (tuple, list)):
        return output(result[0])
    raise TypeError(f"no tensor output in {type(result).__name__}")


def _text(tt: bool = False, mask: bool = True) -> Callable[[int, int], dict]:
    def make(batch: int, seq: int) -> dict:
        kw = {"input_ids": torch.randint(0, VOCAB, (batch, seq))}
        if mask:
            m = torch.ones(batch, seq, dtype=torch.long)
            m[0, seq // 2:] = 0                      # one padded row
            kw["attention_mask"] = m
        if tt:
            kw["token_type_ids"] = torch.randint(0, 2, (batch, seq))
        return kw
    return make


def _image(channels: int = 3, size: int = 32) -> Callable[[int, int], dict]:
    return lambda batch, seq: {"pixel_values": torch.randn(batch, channels, size, size)}


def _build(name: str) -> HFModel:
    T = _tf()
    if name == "gpt2":
        m = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0))
        return HFModel(name, m, _text(), True)
    if name == "bert":
        m = T.BertModel(T.BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL))
        return HFModel(name, m, _text(tt=True), True)
    if name == "llama":
        m = T.LlamaModel(T.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "whisper":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder
        cfg = T.WhisperConfig(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256,
                              num_mel_bins=16, max_source_positions=32)
        # The encoder takes exactly 2 * max_source_positions frames: only the batch varies.
        return HFModel(name, WhisperEncoder(cfg), lambda b, s: {"input_features": torch.randn(b, 16, 64)}, False)
    if name == "vit":
        return HFModel(name, T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, **SMALL)), _image(), False)
    if name == "resnet":
        m = T.ResNetModel(T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]))
        return HFModel(name, m, _image(), False)
    # Other architectures users have, tried beyond the six the issue names.
    if name == "mobilenetv2":
        return HFModel(name, T.MobileNetV2Model(T.MobileNetV2Config(image_size=32, depth_multiplier=0.35)), _image(), False)
    if name == "convnext":
        m = T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32))
        return HFModel(name, m, _image(), False)
    if name == "t5":
        m = T.T5EncoderModel(T.T5Config(vocab_size=VOCAB, d_model=128, d_ff=256, num_layers=2, num_heads=4, d_kv=32))
        return HFModel(name, m, _text(), True)
    if name == "mistral":
        m = T.MistralModel(T.MistralConfig(vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2,
                                           sliding_window=8, **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "qwen2":
        m = T.Qwen2Model(T.Qwen2Config(vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "roberta":
        m = T.RobertaModel(T.RobertaConfig(vocab_size=VOCAB, max_position_embeddings=66, **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "distilbert":
        m = T.DistilBertModel(T.DistilBertConfig(vocab_size=VOCAB, dim=128, n_layers=2, n_heads=4, hidden_dim=256,
                                                 max_position_embeddings=64))
        return HFModel(name, m, _text(), True)
    # More families, through xg.compile only (test_transformers.py).
    if name == "gpt_neox":
        m = T.GPTNeoXModel(T.GPTNeoXConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "gemma":
        m = T.GemmaModel(T.GemmaConfig(vocab_size=VOCAB, max_position_embeddings=64, num_key_value_heads=2, head_dim=32,
                                       **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "phi":
        return HFModel(name, T.PhiModel(T.PhiConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL)), _text(), True)
    if name == "deberta_v2":
        m = T.DebertaV2Model(T.DebertaV2Config(vocab_size=VOCAB, max_position_embeddings=64, **SMALL))
        return HFModel(name, m, _text(), True)
    if name == "bart_encoder":
        cfg = T.BartConfig(vocab_size=VOCAB, d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64)
        return HFModel(name, T.BartModel(cfg).encoder, _text(), True)
    if name == "bloom":          # ALiBi positions
        m = T.BloomModel(T.BloomConfig(vocab_size=VOCAB, hidden_size=128, n_layer=2, n_head=4))
        return HFModel(name, m, _text(), True)
    if name == "swin":
        cfg = T.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)
        return HFModel(name, T.SwinModel(cfg), _image(), False)
    if name == "clip_vision":
        return HFModel(name, T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, patch_size=8, **SMALL)), _image(), False)
    if name == "wav2vec2":
        cfg = T.Wav2Vec2Config(vocab_size=32, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **SMALL)
        return HFModel(name, T.Wav2Vec2Model(cfg), lambda b, s: {"input_values": torch.randn(b, 800)}, False)
    raise KeyError(name)


REQUIRED = ("gpt2", "bert", "llama", "whisper", "vit", "resnet")
OTHERS = ("mobilenetv2", "convnext", "t5", "mistral", "qwen2", "roberta", "distilbert")
MORE = ("gpt_neox", "gemma", "phi", "deberta_v2", "bart_encoder", "bloom", "swin", "clip_vision", "wav2vec2")


def build(name: str, seed: int = 0) -> HFModel:
    torch.manual_seed(seed)
    hf = _build(name)
    hf.model.eval()
    if hasattr(hf.model.config, "use_cache"):
        hf.model.config.use_cache = False
    return hf


def reference(model: torch.nn.Module, kwargs: dict) -> torch.Tensor:
    """The model's output in float64, eager."""
    import copy
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        return output(m(**{k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
