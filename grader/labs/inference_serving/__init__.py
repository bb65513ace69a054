"""Lab 03, inference: prefill and decode, the KV cache, batching, vLLM, quantization.

Everything of the lab lives in this folder (see ``grader/labs/__init__.py``). The notebook is
``grader/source/03_inference_serving/``.
"""
ASSIGNMENT = "03_inference_serving"
