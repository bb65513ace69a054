"""Where a training step's time goes: the profiler run, its trace read as events and measures, and a plain-language
diagnosis.

- ``profiling``: running the PyTorch profiler on a training loop: where does a training step's time go?.
- ``profile_diagnosis``: A profiled loop's per-step numbers and a plain-language diagnosis of where its time goes.
- ``diagnosis_cases``: profiles of loops with a known bottleneck, for grading a diagnosis someone else wrote.
- ``trace_events``: reading a PyTorch profiler trace: Chrome-trace files, dicts or ``prof.events()`` as
  :class:`Event` s.
- ``trace_metrics``: measures of a profiled training step, each a pure function of trace events
  (``utils/diagnosis/trace_events.py``).
- ``loop_audit``: A training loop someone else wrote, audited: what it really does per step, and how fast.
"""
