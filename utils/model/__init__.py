"""Models for the labs: presets and real checkpoints, published shapes, servable directories, quantized weights.

- ``models``: models, tokenizers and text for the labs: real checkpoints from the Hugging Face hub where the runtime
  can download them, the same shapes with random weights from the repo otherwise.
- ``weights``: which weights a lab's model gets: a real open-weights checkpoint from the Hugging Face hub, or random
  weights in the same shape, and the one line that says which and why.
- ``model_dir``: A servable model directory: a preset's real checkpoint from the hub cache where there is one
  (:func:`real_model_dir`), else its shape with random weights and the shipped tokenizer; either way a generation
  config that fixes every request's output length.
- ``model_shapes``: published model shapes the labs count without downloading weights.
- ``quantize``: weight-only quantization with bitsandbytes: 8-bit and 4-bit NF4 against the 16-bit model.
- ``int8_checkpoint``: write a compressed-tensors INT8 W8A8 (or 4-bit W4A16) checkpoint from a 16-bit model
  directory.
"""
