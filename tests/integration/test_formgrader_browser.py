"""An instructor's first class, end to end, as docs/grading.md ("Written answers") tells it: lab 00
graded by ``python -m grader autograde`` (the reference answers, the untouched release, a file that
is no notebook), loaded into a course root by ``python -m grader gradebook``, then nbgrader's
formgrader served by ``jupyter server`` in that course root and driven in headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, which .ci/install-services.sh installs; selenium
from requirements-dev.txt): "Manage Assignments" counts the submissions, the "Manual Grading" list
leads to the write-ups' grading page, where the manual grades are typed. They must then be in the
gradebook, in ``nbgrader export``'s total, in the feedback and ``grades.csv`` that ``python -m
grader feedback`` regenerates, and in ``python -m grader export`` (with every student's status)
and its Canvas file. Without Chromium or selenium the test skips with the reason, except in CI
(``CI=true``), where it fails."""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from grader.release import reference_submission
from tests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
A = "00_foundations"
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")
pytestmark = pytest.mark.slow
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing(why: str):
    if IN_CI:
        pytest.fail(f"{why} in CI: .ci/install-services.sh installs chromium and chromium-driver, "
                    "requirements-dev.txt selenium")
    pytest.skip(why)


def _browser_parts() -> tuple[str, str]:
    """Chromium's binary (the real one, not Debian's launcher script) and chromedriver."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        _missing("selenium is not installed (pip install -r requirements-dev.txt)")
    binary = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
                   if p and Path(p).is_file()), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        _missing("chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    return binary, driver


def _run(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args[:4])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once (``--jobs 2``) and loaded into a course root of its own."""
    tmp = tmp_path_factory.mktemp("first-class")
    subs = tmp / "submissions"
    subs.mkdir()
    (subs / "ana.ipynb").write_text(json.dumps(reference_submission(A)))
    shutil.copyfile(ROOT / "notebooks" / f"{A}.ipynb", subs / "bo.ipynb")
    (subs / "cy.ipynb").write_text("this is not a notebook")
    out, course = tmp / "out", tmp / "course"
    _run(sys.executable, "-m", "grader", "autograde", "--assignment", A, "--submissions", str(subs), "--out", str(out),
         "--jobs", "2", "--quiet")
    course.mkdir()
    shutil.copyfile(ROOT / "grader" / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "grader" / "source" / A, course / "source" / A)
    loaded = _run(sys.executable, "-m", "grader", "gradebook", str(out), "--course", str(course))
    return {"out": out, "course": course, "tmp": tmp, "gradebook_stdout": loaded.stdout,
            "gradebook_stderr": loaded.stderr}


def test_the_gradebook_command_says_how_to_reach_the_formgrader_and_warns_nothing(graded):
    said = graded["gradebook_stdout"]
    assert "loaded 2 graded submissions" in said and "cy: no graded notebook" in said
    assert "jupyter server" in said and "/formgrader" in said and "nbgrader formgrader" not in said
    assert f"python -m grader feedback {graded['out']}" in said
    assert "Warning" not in graded["gradebook_stderr"], graded["gradebook_stderr"]  # SQLAlchemy's, silenced


def test_cy_unreadable_gets_a_feedback_file_saying_why(graded):
    page = (graded["out"] / "feedback" / "cy" / f"{A}.html").read_text()
    assert "not graded" in page and "is a .ipynb file, not a Jupyter notebook" in page and "0 / 24" in page


def _serve(course: Path, tmp: Path):
    """``jupyter server`` in the course root, as docs/grading.md says (a course root outside the
    repository needs the repository on PYTHONPATH: its nbgrader_config.py imports the grader)."""
    port, token = free_port(), "first-class"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    log = open(tmp / "jupyter-server.log", "wb")
    proc = subprocess.Popen(["jupyter", "server", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
                             "--allow-root", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={course}"],
                            cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # its start on a busy machine
    while True:
        try:
            req = urllib.request.Request(f"{base}/formgrader/api/assignments", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assignments = json.loads(r.read())
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise AssertionError(f"jupyter server did not serve the formgrader: "
                                     f"{(tmp / 'jupyter-server.log').read_text()[-2000:]}") from None
            time.sleep(1)
    return proc, base, token, assignments


def _stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_manual_grades_typed_in_the_formgrader_reach_gradebook_feedback_and_exports(graded, tmp_path):
    binary, driver_path = _browser_parts()
    from nbgrader.api import Gradebook
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    out, course = graded["out"], graded["course"]
    server, base, token, assignments = _serve(course, tmp_path)
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}"]:
        opts.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        # "Manage Assignments" counts the loaded submissions (formgrader's JSON API and the page alike)
        assert [a["num_submissions"] for a in assignments if a["name"] == A] == [2], assignments
        wait = WebDriverWait(browser, 120)
        browser.get(f"{base}/formgrader/manage_assignments?token={token}")
        counts = wait.until(lambda b: [e.text for e in b.find_elements(By.CSS_SELECTOR, ".num-submissions") if e.text])
        assert counts == ["2"], counts
        # "Manual Grading": the notebook's submissions, then ana's grading page
        browser.get(f"{base}/formgrader/gradebook/{A}/{A}")
        links = wait.until(lambda b: {e.get_attribute("textContent"): e.get_attribute("href")
                                      for e in b.find_elements(By.CSS_SELECTOR, "a.name-shown")} or None)
        assert set(links) == {"ana", "bo"}, links
        browser.get(links["ana"])
        for cell, score in (("limiter_writeup", "1.5"), ("sweep_writeup", "1.75")):
            box = wait.until(lambda b, cell=cell: b.find_element(By.ID, cell))
            box.clear()
            box.send_keys(score, Keys.TAB)  # the formgrader saves a score on change
        assert "Quoted numbers:" in browser.page_source  # the number check beside each write-up
        sub_id = links["ana"].rstrip("/").rsplit("/", 1)[-1]

        def saved(_):
            req = urllib.request.Request(f"{base}/formgrader/api/grades?submission_id={sub_id}",
                                         headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                grades = {g["name"]: g["manual_score"] for g in json.loads(r.read())}
            return grades if grades.get("limiter_writeup") == 1.5 and grades.get("sweep_writeup") == 1.75 else None
        wait.until(saved)
        browser.refresh()  # the grade survives a reload of the page
        box = wait.until(lambda b: b.find_element(By.ID, "sweep_writeup"))
        wait.until(lambda b: box.get_attribute("value") == "1.75")
    finally:
        browser.quit()
        _stop(server)

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        sub = gb.find_submission(A, "ana")
        assert sub.score == 23.25 and not sub.needs_manual_grade
        assert gb.find_grade("limiter_writeup", A, A, "ana").manual_score == 1.5

    # nbgrader's own export has the manual grades in the total; it leaves cy out altogether
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    _run(sys.executable, "-m", "nbgrader", "export", "--to", str(tmp_path / "nbgrader.csv"), cwd=course, env=env)
    with open(tmp_path / "nbgrader.csv", newline="") as fh:
        theirs = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert float(theirs["ana"]["score"]) == 23.25 and set(theirs) == {"ana", "bo"}

    # feedback and grades.csv, regenerated from the gradebook
    before = (out / "feedback" / "ana" / f"{A}.html").read_text()
    assert "(Score: 1.5 / 2.0)" not in before
    said = _run(sys.executable, "-m", "grader", "feedback", str(out), "--course", str(course)).stdout
    assert "for 2 students" in said
    page = (out / "feedback" / "ana" / f"{A}.html").read_text()
    assert "(Score: 1.5 / 2.0)" in page and "(Score: 1.75 / 2.0)" in page and "Score: 23.25 / 24.0" in page
    with open(out / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert float(rows["ana"]["score"]) == 23.25 and rows["ana"]["needs_manual_grade"] == ""
    assert float(rows["ana"]["verified_score"]) == 23.25 and float(rows["bo"]["score"]) == 0
    assert "not a Jupyter notebook" in rows["cy"]["status"]

    # our export: every student, with status and why; and the Canvas file with the manual grades
    _run(sys.executable, "-m", "grader", "export", str(out), "--course", str(course), "--out", str(tmp_path / "all.csv"))
    with open(tmp_path / "all.csv", newline="") as fh:
        ours = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert [ours[s]["status"] for s in ("ana", "bo", "cy")] == ["graded", "graded", "not graded"]
    assert ours["ana"]["score"] == "23.25" and "not a Jupyter notebook" in ours["cy"]["why"]
    (tmp_path / "roster.csv").write_text("student_id,name,email,sis_id\nana,Ana A,ana@example.edu,S1\n"
                                         "bo,Bo B,bo@example.edu,S2\ncy,Cy C,cy@example.edu,S3\n")
    _run(sys.executable, "-m", "grader", "export", str(out), "--course", str(course), "--format", "canvas",
         "--roster", str(tmp_path / "roster.csv"), "--out", str(tmp_path / "canvas.csv"))
    with open(tmp_path / "canvas.csv", newline="", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A]
    assert table[1] == ["Points Possible", "", "", "", "", "24"]
    assert [r[2] for r in table[2:]] == ["S1", "S2", "S3"] and [r[5] for r in table[2:]] == ["23.25", "0", "0"]
