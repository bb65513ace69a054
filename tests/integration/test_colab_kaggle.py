"""A learner's first hour on Colab and Kaggle, simulated on a CPU machine.

Each lab's released notebook is copied alone into an empty folder that stands for Colab's
``/content`` or Kaggle's ``/kaggle/working`` (``GPULAB_CLONE_DIR``, which the setup cell
honours). The runtime is a stand-in ``google.colab`` package on the kernel's ``PYTHONPATH`` or
Kaggle's environment variables; the course is served from a local bare git repository made
from a snapshot of this working tree (``GPULAB_REPO_URL=file://...``). The setup cell must
clone it, install nothing (this virtualenv has every package) and leave the lab to run in smoke
mode with the reference answers typed in, each cell as a learner runs it (nbclient, as nbgrader
executes): whole for two labs (:data:`WHOLE`), to the device cell for the others. The cases
where the course cannot be had (a wrong URL, no URL and no zip, the old placeholder URL) must
end the cell with one line that says what to do, and no traceback; an uploaded zip or an
attached Kaggle dataset must be found.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.nbcells import gid, src

ROOT = Path(__file__).resolve().parents[2]
LABS = ("00_foundations", "01_single_gpu", "02_multi_gpu", "03_inference_serving", "04_benchmarking_production",
        "05_hardware_and_cost")
HOST = {lab: ("colab", "kaggle")[i % 2] for i, lab in enumerate(LABS)}  # each runtime for three labs
PLACEHOLDER = "REPLACE-WITH-COURSE-ORG"
CELL_TIMEOUT_S = 900  # a serving lab starts an engine in one cell (grader/course.py ENGINE_SMOKE_TIMEOUT_S)
LAB_TIMEOUT_S = 3600  # a whole lab in smoke mode on two shared cores; an estimate with room, not a measurement
NO_GPU_LINE = {"02_multi_gpu": "To get GPUs:"}  # the other labs print the smoke-mode line
# Run whole from the clone, one lab per runtime (the serving lab starts an engine there); the others run
# up to their device cell from the clone, and whole from the repository in every reference grade
# (graded_reference, tests/conftest.py)
WHOLE = ("00_foundations", "03_inference_serving")


def _git(*args: str, cwd: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "course", "GIT_AUTHOR_EMAIL": "course@example.invalid",
           "GIT_COMMITTER_NAME": "course", "GIT_COMMITTER_EMAIL": "course@example.invalid"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> dict:
    """The working tree's files (tracked and untracked, not ignored) committed into a fresh repository,
    served bare; and the same tree as GitHub's "Download ZIP" gives it (one top folder)."""
    tmp = tmp_path_factory.mktemp("course")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    tree = tmp / "gpu-utilization-roadmap-main"
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tree / rel)
    _git("init", "-q", "-b", "main", cwd=tree)
    _git("add", "-A", cwd=tree)
    _git("commit", "-q", "-m", "snapshot", cwd=tree)
    _git("clone", "-q", "--bare", str(tree), str(tmp / "course.git"), cwd=tmp)
    zipped = tmp / "gpu-utilization-roadmap-main.zip"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(tree.rglob("*")):
            if p.is_file() and ".git" not in p.relative_to(tree).parts:
                z.write(p, p.relative_to(tmp).as_posix())
    return {"url": (tmp / "course.git").as_uri(), "zip": zipped, "tree": tree}


@pytest.fixture()
def kernel_name(tmp_path, monkeypatch) -> str:
    """A kernel spec for this interpreter, found first (a user's own ``python3`` spec could point elsewhere)."""
    spec = tmp_path / "jupyter" / "kernels" / "gpulab-sim"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "display_name": "sim", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "gpulab-sim"


def runtime(host: str, tmp: Path, url: str | None) -> tuple[dict, Path]:
    """The kernel's environment on ``host`` and the folder that stands for its working directory."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPULAB_", "KAGGLE_", "COLAB_", "JPY_")) and k not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    env["HF_HUB_OFFLINE"] = "1"  # CI is offline; the labs build their models from shipped configs
    if host == "colab":
        stub = tmp / "colab-stub" / "google" / "colab"  # no google/__init__.py: google stays a namespace package
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text('"""A stand-in for Colab\'s google.colab package."""\n')
        env["PYTHONPATH"] = str(tmp / "colab-stub")
        base = tmp / "content"
    elif host == "kaggle":
        env.update(KAGGLE_KERNEL_RUN_TYPE="Interactive", KAGGLE_URL_BASE="https://www.kaggle.com")
        base = tmp / "kaggle" / "working"
    else:  # a cloud VM running Jupyter: neither Colab nor Kaggle, the notebook alone in a folder
        base = tmp / "vm"
    base.mkdir(parents=True)
    env["GPULAB_CLONE_DIR"] = str(base)
    if url is not None:
        env["GPULAB_REPO_URL"] = url
    return env, base


def released(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / f"{lab}.ipynb", as_version=4)


def execute(nb, env: dict, cwd: Path, kernel: str, timeout_s: int = 120):
    """Run ``nb`` top to bottom in ``cwd`` as a learner's Run all does; stops at the first error."""
    client = NotebookClient(nb, timeout=timeout_s, kernel_name=kernel, resources={"metadata": {"path": str(cwd)}})
    client.execute(env=env)
    return nb


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def setup_only(lab: str, host: str, tmp: Path, url: str | None, kernel: str):
    """The lab's setup cell alone, run in the runtime; ``(cell, error, base)``."""
    env, base = runtime(host, tmp, url)
    shutil.copy(ROOT / "notebooks" / f"{lab}.ipynb", base)
    nb = released(lab)
    nb.cells = [c for c in nb.cells if gid(c) == "setup"]
    try:
        execute(nb, env, base, kernel)
        error = None
    except CellExecutionError as exc:
        error = exc
    return nb.cells[0], error, base


def one_line_stop(cell, error) -> str:
    """The cell stopped with one line of output and no traceback: that line."""
    assert error is not None, "the setup cell should have stopped"
    (out,) = [o for o in cell.outputs if o["output_type"] == "error"]
    assert out["ename"] == "SetupStopped", out
    assert len(out["traceback"]) == 1 and "\n" not in out["traceback"][0], out["traceback"]
    line = out["traceback"][0]
    for noise in ("Traceback", "CalledProcessError", 'File "', "----"):
        assert noise not in line
    assert not [o for o in cell.outputs if o.get("name") == "stderr"], cell.outputs
    assert line.startswith("Setup stopped: ") and line.endswith("then run this cell again"), line
    return line


# -- the release ----------------------------------------------------------------------------------

@pytest.mark.parametrize("lab", LABS)
def test_no_released_notebook_holds_the_placeholder_and_each_carries_the_published_url(lab):
    from grader.release import SETTING_LINES, published

    text = (ROOT / "notebooks" / f"{lab}.ipynb").read_text()
    assert PLACEHOLDER not in text
    setup = src(next(c for c in released(lab).cells if gid(c) == "setup"))
    pub = published()
    assert SETTING_LINES["url"].search(setup).group(2) == json.dumps(pub.url)
    assert SETTING_LINES["branch"].search(setup).group(2) == json.dumps(pub.branch)
    assert f'bootstrap.setup("{lab}", REPO)' in setup


def test_the_course_file_is_read_and_bad_settings_are_one_line(tmp_path):
    from grader.course import CourseError
    from grader.release import Published, published

    f = tmp_path / "course.toml"
    f.write_text('[repository]\nurl = "https://github.com/some-org/gpu-course.git"\nbranch = "spring"\n')
    assert published(f) == Published("https://github.com/some-org/gpu-course.git", "spring")
    assert published(f).github == ("some-org", "gpu-course")
    for text, words in (('[repository]\nurl = "https://github.com/REPLACE-WITH-COURSE-ORG/x"\n', "is a placeholder"),
                        ('[repository]\nurl = "github.com/org/x"\n', "is not a git URL"),
                        ('[repository]\nurl = ""\nbranch = "a b"\n', "is not a branch name"),
                        ("[repository\n", "does not read as TOML"), ("x = 1\n", "needs a [repository] table")):
        f.write_text(text)
        with pytest.raises(CourseError, match=re.escape(words)) as info:
            published(f)
        assert "\n" not in str(info.value)
    with pytest.raises(CourseError, match="no course.toml at"):
        published(tmp_path / "elsewhere" / "course.toml")


def test_links_are_colab_and_kaggle_forms_of_the_published_notebooks():
    from grader.release import Published, links, with_links

    body = links(Published("https://github.com/some-org/gpu-course", "main"), ["00_foundations"])
    assert ("(https://colab.research.google.com/github/some-org/gpu-course/blob/main/notebooks/00_foundations.ipynb)"
            in body)
    assert ("(https://kaggle.com/kernels/welcome?src=https://github.com/some-org/gpu-course/blob/main/notebooks/"
            "00_foundations.ipynb)" in body)
    assert "Open In Colab" in body and "Phase 0" in body
    assert "http" not in links(Published("", "main"), ["00_foundations"])  # no address, no links
    assert "not on github.com" in links(Published("https://gitlab.com/org/course.git", "main"), ["00_foundations"])
    readme = (ROOT / "README.md").read_text()
    assert with_links(readme, links(Published("", "main"), list(LABS))) == readme  # the README is what the release writes


def test_a_release_stamps_the_url_and_the_cell_clones_it_without_any_variable(course, tmp_path, kernel_name):
    from grader.release import Published, released_text

    lab = "05_hardware_and_cost"
    nb = nbformat.reads(released_text(lab, pub=Published(course["url"], "main")), as_version=4)
    nb.cells = [c for c in nb.cells if gid(c) == "setup"]
    assert f'os.environ.get("GPULAB_REPO_URL", {json.dumps(course["url"])})' in src(nb.cells[0])
    env, base = runtime("colab", tmp_path, None)
    execute(nb, env, base, kernel_name, timeout_s=300)
    assert f"course repository: {base / 'gpu-utilization-roadmap'} | installed: nothing" in text_of(nb.cells[0])


# -- what a learner sees when the course cannot be had -------------------------------------------

@pytest.mark.parametrize("host", ["colab", "kaggle"])
def test_a_wrong_url_stops_with_one_line(host, tmp_path, kernel_name):
    wrong = (tmp_path / "no-such-course.git").as_uri()
    cell, error, base = setup_only("05_hardware_and_cost", host, tmp_path, wrong, kernel_name)
    line = one_line_stop(cell, error)
    assert f"cloning {wrong} (branch main) failed: fatal:" in line, line
    assert f"upload the course's zip to {base}/" in line


def test_a_branch_that_is_not_there_stops_with_one_line(course, tmp_path, kernel_name):
    env, base = runtime("kaggle", tmp_path, course["url"])
    env["GPULAB_REPO_BRANCH"] = "no-such-branch"
    shutil.copy(ROOT / "notebooks" / "02_multi_gpu.ipynb", base)
    nb = released("02_multi_gpu")
    nb.cells = [c for c in nb.cells if gid(c) == "setup"]
    with pytest.raises(CellExecutionError):
        execute(nb, env, base, kernel_name)
    line = one_line_stop(nb.cells[0], True)
    assert "(branch no-such-branch) failed: fatal: Remote branch no-such-branch not found" in line, line


@pytest.mark.parametrize("host", ["colab", "kaggle"])
def test_no_url_and_no_zip_stops_with_one_line_naming_where_the_zip_goes(host, tmp_path, kernel_name):
    cell, error, base = setup_only("02_multi_gpu", host, tmp_path, "", kernel_name)
    line = one_line_stop(cell, error)
    assert "does not say where the course is published" in line and f"{base}/ holds neither the course nor its zip" in line
    assert ("mount the Drive" in line) if host == "colab" else ("attach the course as a dataset" in line), line
    assert "GPULAB_REPO_URL" in line


@pytest.mark.parametrize("host", ["colab", "kaggle"])
def test_the_placeholder_url_stops_with_one_line(host, tmp_path, kernel_name):
    url = f"https://github.com/{PLACEHOLDER}/gpu-utilization-roadmap"
    cell, error, _ = setup_only("04_benchmarking_production", host, tmp_path, url, kernel_name)
    line = one_line_stop(cell, error)
    assert f"the course URL {url!r} is a placeholder" in line, line


@pytest.mark.parametrize("host", ["colab", "kaggle"])
def test_an_uploaded_zip_is_found_and_unpacked(host, course, tmp_path, kernel_name):
    env, base = runtime(host, tmp_path, "")
    shutil.copy(course["zip"], base)
    nb = released("03_inference_serving")
    nb.cells = [c for c in nb.cells if gid(c) == "setup"]
    execute(nb, env, base, kernel_name, timeout_s=300)
    out = text_of(nb.cells[0])
    assert f"course repository: {base / 'gpu-utilization-roadmap-main'} | installed: nothing" in out, out
    assert (base / "gpu-utilization-roadmap-main" / "utils" / "course" / "bootstrap.py").is_file()


def test_on_a_vm_running_jupyter_the_url_is_cloned_too(course, tmp_path, kernel_name):
    env, base = runtime("local", tmp_path, course["url"])
    shutil.copy(ROOT / "notebooks" / "01_single_gpu.ipynb", base)
    nb = released("01_single_gpu")
    nb.cells = [c for c in nb.cells if gid(c) == "setup"]
    execute(nb, env, base, kernel_name, timeout_s=300)
    out = text_of(nb.cells[0])
    assert f"course repository: {base / 'gpu-utilization-roadmap'} | installed: nothing" in out, out


def test_on_a_vm_without_the_course_or_a_url_the_line_names_both_ways(tmp_path, kernel_name):
    cell, error, base = setup_only("01_single_gpu", "local", tmp_path, "", kernel_name)
    line = one_line_stop(cell, error)
    assert f"no folder from {base} up holds the course" in line and "GPULAB_REPO_URL" in line and "GPULAB_REPO " in line, line


def test_a_course_attached_as_a_kaggle_dataset_is_found(course, tmp_path, kernel_name):
    env, base = runtime("kaggle", tmp_path, "")
    where = base.parent / "input" / "gpu-course" / "gpu-utilization-roadmap-main"  # Kaggle unpacks an uploaded zip there
    shutil.copytree(course["tree"], where, ignore=shutil.ignore_patterns(".git"))
    for d in (where, *[p for p in where.rglob("*") if p.is_dir()]):
        d.chmod(0o555)  # read-only, as /kaggle/input is
    try:
        expected = where if os.access(where, os.W_OK) else base / where.name  # root may write anyway: then used in place
        nb = released("05_hardware_and_cost")
        nb.cells = [c for c in nb.cells if gid(c) == "setup"]
        execute(nb, env, base, kernel_name, timeout_s=300)
    finally:
        for d in (where, *[p for p in where.rglob("*") if p.is_dir()]):
            d.chmod(0o755)
    out = text_of(nb.cells[0])
    assert f"course repository: {expected} | installed: nothing" in out, out


# -- a whole lab, cloned -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(LAB_TIMEOUT_S)
@pytest.mark.parametrize("lab", LABS)
def test_the_lab_runs_after_cloning_the_course(lab, course, tmp_path, kernel_name):
    from grader.release import reference_submission

    host = HOST[lab]
    env, base = runtime(host, tmp_path, course["url"])
    nb = nbformat.reads(json.dumps(reference_submission(lab)), as_version=4)  # the release with the answers typed in
    if lab not in WHOLE:
        nb.cells = nb.cells[:next(i for i, c in enumerate(nb.cells) if gid(c) == "device") + 1]
    nbformat.write(nb, base / f"{lab}.ipynb")
    assert sorted(p.name for p in base.iterdir()) == [f"{lab}.ipynb"]
    nb.cells.append(nbformat.v4.new_code_cell("import grader, utils\nprint('imported from', utils.__file__, grader.__file__)"))
    try:
        execute(nb, env, base, kernel_name, timeout_s=CELL_TIMEOUT_S)
    except CellExecutionError as exc:
        pytest.fail(f"{lab} on {host}: a cell raised: {str(exc)[-1500:]}")
    clone = base / "gpu-utilization-roadmap"
    setup_out = text_of(next(c for c in nb.cells if gid(c) == "setup"))
    assert f"course repository: {clone} | installed: nothing" in setup_out, setup_out
    assert "installed " not in setup_out.replace("installed: nothing", "") and "could not install" not in setup_out
    device_out = text_of(next(c for c in nb.cells if gid(c) == "device"))
    assert NO_GPU_LINE.get(lab, "NO GPU in this runtime: running in SMOKE MODE") in device_out, device_out
    assert f"platform {host}" in device_out, device_out
    last = text_of(nb.cells[-1])
    assert last.count(str(clone)) == 2, last
