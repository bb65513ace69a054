"""The course's benchmark scripts (each runs as ``python benchmarks/<name>.py``; what each measures is in
``docs/architecture.md``, its results in ``benchmarks/RESULTS.md``) and the modules the multi-GPU training
script is built from (``multi_gpu_*.py``), importable as ``benchmarks.<module>`` once ``pip install -e .``
has installed the course (pyproject.toml)."""
