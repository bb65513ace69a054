"""Lab 05, hardware and cost: cost per token, right-sizing, fault tolerance, XLA and TPU pods.

Everything of the lab lives in this folder (see ``grader/labs/__init__.py``). The notebook is
``grader/source/05_hardware_and_cost/``.
"""
ASSIGNMENT = "05_hardware_and_cost"
