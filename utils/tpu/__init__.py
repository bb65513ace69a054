"""TPUs and XLA: pods and systolic arrays in numbers, and JAX's compilation model.

- ``tpu_pod``: TPU pods and systolic arrays in numbers, and a pod programmed in miniature: ``jax.sharding`` over
  several CPU devices.
- ``xla``: JAX under XLA: jit, static shapes, and what a recompilation costs.
"""
