"""Lab 00, foundations: tensors on the GPU, timing, the roofline, a monitored training run, a matmul sweep.

Everything of the lab lives in this folder: ``sizes`` (per tier), ``answers`` (the typed seam between
the notebook and the grader), ``judges`` (how each graded cell is judged), ``reference`` (the grader's
own measurements, live or from a record). The notebook is ``grader/source/00_foundations/``.
"""
ASSIGNMENT = "00_foundations"
