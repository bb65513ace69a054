"""Names the notebook, the sandboxes and the grader share, each defined once.

The notebook (on Colab too) imports this module through :mod:`grader.answers`, so it imports
nothing heavy. ``utils`` keeps its own variables (``GPULAB_SMOKE``, ``GPULAB_TIER``,
``GPULAB_WEIGHTS``): they configure measurement, not grading.
"""

ANSWERS_MARK = "gpulab-answers: "  # the one line an export cell prints: this mark, then the cell's answers as JSON
SANDBOX_MARK = "gpulab-sandbox: "  # a sandbox's replies on its result pipe start with this
GRADING_VAR = "GPULAB_GRADING"  # "1" in every process a grading run starts (a lab's setup installs nothing then)
REPO_VAR = "GPULAB_REPO"  # where the course repository is, for a kernel that runs outside it
CELL_TIMEOUT_VAR = "GPULAB_CELL_TIMEOUT"  # seconds per cell while grading, overrides the default
KEEP_DIRS_VAR = "GPULAB_KEEP_GRADING_DIRS"  # 1: keep the temporary course copies, for debugging the grader
RECORD_SCHEMA = "gpulab.record/2"  # a measurement record: the answers of every graded cell and the machine

LIVE = "measured live"  # a measured cell, re-measured by the grader on this machine
RECORD = "graded from record"  # a measured cell, judged against the learner's record (provisional)
COMPUTED = "computed"  # a cell with nothing to measure: the answers judged against the rule itself
