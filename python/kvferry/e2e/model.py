"""The model an end-to-end run serves: transformers' Llama with random
weights (fixed seed) in a named shape, or a checkpoint from a local path.

Shapes: ``8b`` is Llama-3-8B (hidden 4096, 32 layers, 32 heads, 8 KV
heads, intermediate 14336, vocab 128256, rope theta 5e5); ``tiny`` is 2
layers with a small hidden size, for CPU tests. Attention is sdpa.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict

SHAPES: Dict[str, Dict[str, Any]] = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               max_position_embeddings=131072),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               max_position_embeddings=131072),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=16384),
}
ROPE_THETA = 500000.0


@dataclass
class Loaded:
    model: Any
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    q_heads: int
    vocab: int
    dtype: Any
    device: Any
    params: int

    def shape(self):
        from .policy import Shape
        return Shape(self.layers, self.kv_heads, self.head_dim, self.q_heads, float(self.params),
                     float(self.dtype.itemsize))

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


def _config(shape: str):
    from transformers import LlamaConfig
    kw = dict(SHAPES[shape])
    try:
        cfg = LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    except TypeError:
        cfg = LlamaConfig(**kw, rope_theta=ROPE_THETA)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(shape_or_path: str, device: str = "cuda", dtype: str = "bfloat16",
          seed: int = 0) -> Loaded:
    """The model in eval mode on device. A path loads a checkpoint
    (config and weights) from disk; otherwise a named shape gets random
    weights drawn from ``seed``."""
    import torch
    from transformers import LlamaForCausalLM

    dt = getattr(torch, dtype)
    if os.path.isdir(shape_or_path):
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(shape_or_path, dtype=dt,
                                                     attn_implementation="sdpa").to(device)
        name = os.path.basename(os.path.normpath(shape_or_path))
    else:
        if shape_or_path not in SHAPES:
            raise ValueError("model is a shape (%s) or a checkpoint folder" % ", ".join(SHAPES))
        torch.manual_seed(seed)
        cfg = _config(shape_or_path)
        old = torch.get_default_dtype()
        torch.set_default_dtype(dt)
        try:
            with torch.device(device):
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(old)
        name = "llama-%s-random-seed%d" % (shape_or_path, seed)
    model.eval()
    c = model.config
    heads = c.num_attention_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // heads
    params = sum(p.numel() for p in model.parameters())
    # the embedding is a lookup, not a matmul: leave it out of the FLOPs
    params -= c.vocab_size * c.hidden_size
    return Loaded(model, name, c.num_hidden_layers, c.num_key_value_heads, hd, heads,
                  c.vocab_size, dt, torch.device(device), params)
