# nbgrader settings for the course. `nbgrader` run from grader/ reads this file, and
# `python -m grader ...` loads the same file (grader/course.py) and then points
# CourseDirectory.root and db_url at a temporary copy of the course, so grading never
# touches a shared gradebook (parallel jobs would fight over one sqlite file).
c = get_config()  # noqa: F821 (traitlets provides get_config in config files)

c.CourseDirectory.course_id = "gpulab"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"

# Solution regions become this stub in the released notebook.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A deleted test cell is put back (and graded) instead of silently scoring nothing.
c.OverwriteCells.add_missing_cells = True

# Per-cell execution limit while grading (seconds). grader/course.py (cell_timeout) replaces
# it with --timeout, or with its default: 600 s on a GPU; in smoke mode 60 s (900 s for a
# serving lab with vLLM) scaled by the machine's measured speed and load.
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True
c.Execute.raise_on_iopub_timeout = True

# Autograde as nbgrader does it, with the grader's steps (grader/preprocessors.py): after sanitizing,
# an export cell before each graded cell; the notebook run under guards; then every graded cell judged
# outside the kernel, in this process, before SaveAutoGrades reads the verdicts from the outputs. After
# SaveAutoGrades, each written answer (a manually graded markdown cell) gets an automatic comment saying
# whether the numbers it quotes are ones this run printed (grader/writeups.py).
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the course root, for `nbgrader` run in grader/
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from grader.preprocessors import GuardedExecute, InsertExports, JudgeCells  # noqa: E402
from grader.writeups import QuotedNumbers  # noqa: E402

c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata,
                                      InsertExports]
c.Autograde.autograde_preprocessors = [GuardedExecute, JudgeCells, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGrades, QuotedNumbers, AssignLatePenalties, CheckCellMetadata]
