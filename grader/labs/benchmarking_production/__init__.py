"""Lab 04, production: load testing, containers, Kubernetes GPU scheduling, metrics.

Everything of the lab lives in this folder (see ``grader/labs/__init__.py``). The notebook is
``grader/source/04_benchmarking_production/``.
"""
ASSIGNMENT = "04_benchmarking_production"
