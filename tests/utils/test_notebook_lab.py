"""utils/course/notebook_lab.py: a renamed notebook is still its lab; the name decides only when the ids do not."""
from __future__ import annotations

import json

from utils.course.notebook_lab import grade_ids, lab_of


def _nb(*ids, plain=0):
    cells = [{"cell_type": "code", "metadata": {"nbgrader": {"grade_id": g}}, "source": ""} for g in ids]
    return {"cells": cells + [{"cell_type": "markdown", "metadata": {}, "source": ""}] * plain}


def test_the_ids_decide_before_the_file_name(tmp_path):
    refs = {}
    for lab, ids in {"00_foundations": ("a", "b", "c"), "01_single_gpu": ("c", "d", "e", "f")}.items():
        refs[lab] = tmp_path / f"{lab}.ipynb"
        refs[lab].write_text(json.dumps(_nb(*ids)))
    assert grade_ids(_nb("a", "b", plain=2)) == {"a", "b"}
    assert lab_of({"a", "b", "d"}, refs, "01_single_gpu (1)") == "00_foundations"  # two ids against one
    assert lab_of({"d", "e"}, refs, "my_run") == "01_single_gpu"
    assert lab_of(set(), refs, "01_single_gpu_copy") == "01_single_gpu"  # no ids: the name
    assert lab_of({"zzz"}, refs, "notes") is None
    refs["02_multi_gpu"] = tmp_path / "missing.ipynb"  # a reference that is not there shares nothing
    assert lab_of({"a"}, refs, "02_multi_gpu") == "00_foundations"


def test_malformed_cells_share_nothing():
    assert grade_ids({"cells": [None, {"metadata": None}, {"metadata": {"nbgrader": "x"}},
                                {"metadata": {"nbgrader": {"grade_id": 3}}}]}) == set()
    assert grade_ids([]) == set()


def test_grader_check_finds_the_lab_of_a_renamed_release(tmp_path):
    import shutil

    import pytest

    from grader import course
    from grader.selfcheck import guess_assignment
    from utils.course.env import repo_root

    for lab in ("00_foundations", "04_benchmarking_production"):
        renamed = tmp_path / "my copy.ipynb"
        shutil.copy(repo_root() / "notebooks" / f"{lab}.ipynb", renamed)
        assert guess_assignment(renamed) == lab
    (tmp_path / "notes.ipynb").write_text("{not json")
    with pytest.raises(course.CourseError, match="notes.ipynb matches no assignment .* pass --assignment"):
        guess_assignment(tmp_path / "notes.ipynb")
