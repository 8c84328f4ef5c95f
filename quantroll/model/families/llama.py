"""Llama 3.x (``LlamaForCausalLM``): no QK-norm; ``attention_bias`` puts biases on q, k, v
*and* o, ``mlp_bias`` on gate, up and down (both false in Meta's releases); the ``llama3``
rope variant rescales the inverse frequencies by wavelength band."""

from __future__ import annotations

import math

import torch

from quantroll.model.families.base import Family, Rope


def llama3_inverse_frequencies(inv: torch.Tensor, rope, max_position_embeddings: int) -> torch.Tensor:
    """transformers' ``_compute_llama3_parameters``: wavelengths longer than
    original / low_freq_factor are divided by ``factor``, shorter than original /
    high_freq_factor kept, the band between interpolated smoothly."""
    original = rope.original_max_position_embeddings or max_position_embeddings
    low_wavelen, high_wavelen = original / rope.low_freq_factor, original / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


LLAMA = Family(
    name="llama", model_types=("llama",), architectures=("LlamaForCausalLM",),
    qk_norm=False, qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias",
    rope_variants=(Rope("llama3", ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                        llama3_inverse_frequencies),),
    shapes=(
        ("llama3.1-8b", dict(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=131072,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        ("llama3.2-1b", dict(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=131072,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    ),
)
