"""Published model shapes the labs count without downloading weights.

``LLAMA_70B`` is the architecture of Meta's Llama 3 70B (``config.json`` of
``meta-llama/Meta-Llama-3-70B`` on the Hugging Face Hub); :func:`llama_70b_params` counts its
parameters by building it with transformers on the meta device (no memory, no weights).
"""
from __future__ import annotations

LLAMA_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}


def llama_70b_params() -> int:
    """Parameters of the Llama-3-70B shape (``LLAMA_70B``), counted by transformers on the meta device."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_70B))
    return sum(t.numel() for t in model.parameters())
