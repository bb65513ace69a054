"""``python -m grader release [--check]``: ``grader/source/`` -> ``notebooks/``.

nbgrader's ``generate_assignment`` strips solutions and hidden tests, locks cells and adds
checksums; it runs on a temporary course copy (with a throw-away gradebook), so a release
writes nothing but ``notebooks/<assignment>.ipynb``. The output is deterministic (same source,
same bytes): nbgrader keeps the source's cell ids, its checksums are hashes of the cell
contents, and the file is written with sorted keys and a final newline. ``--check``
compares the parsed notebooks, not the bytes, so a notebook saved by Jupyter with a
different indent is not reported stale; any difference in cells or metadata is.

Where the course is published is one setting, ``course.toml``'s ``[repository]`` ``url`` and
``branch`` (:func:`published`). A release writes them into each notebook's setup cell (into a
copy of the source before nbgrader runs, so the release's checksums are of the stamped cell) and
writes README.md's "Open in Colab / Kaggle" section from them (:func:`links`); ``--check`` checks
both. ``python -m grader release --student-repo DIR`` then writes the student edition
(``grader/edition.py``).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package (pytest depends on it there)
    import tomli as tomllib

from grader import NOTEBOOKS_DIR, REPO_ROOT, SOURCE_DIR
from grader import course as C

COURSE_FILE = REPO_ROOT / "course.toml"
README = REPO_ROOT / "README.md"
# the two lines of each setup cell that a release fills in (grader/source/<lab>/<lab>.ipynb, cell "setup")
SETTING_LINES = {"url": re.compile(r'^(REPO_URL = os\.environ\.get\("GPULAB_REPO_URL", )("[^"\n]*")(\).*)$', re.M),
                 "branch": re.compile(r'^(BRANCH = os\.environ\.get\("GPULAB_REPO_BRANCH", )("[^"\n]*")(\).*)$', re.M)}
URL_SCHEMES = ("https://", "http://", "ssh://", "git@", "file://")
LINKS_BEGIN = "<!-- open-in: written by `python -m grader release` from course.toml; edit course.toml, not this -->"
LINKS_END = "<!-- /open-in -->"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"


@dataclasses.dataclass(frozen=True)
class Published:
    """Where the course is published (``course.toml``): a git URL ("" when not yet) and a branch."""

    url: str
    branch: str

    @property
    def github(self) -> tuple[str, str] | None:
        """``(owner, repository)`` for a github.com URL, else None (Colab and Kaggle open GitHub notebooks only)."""
        m = re.fullmatch(r"(?:https://github\.com/|git@github\.com:)([\w.-]+)/([\w.-]+?)(?:\.git)?/?", self.url)
        return (m.group(1), m.group(2)) if m else None


def is_placeholder(url: str) -> bool:
    """A URL someone has still to fill in ("REPLACE-WITH-...", "<org>")."""
    return "REPLACE" in url.upper() or "<" in url or "your-org" in url


def published(path: Path = COURSE_FILE) -> Published:
    """``course.toml``'s ``[repository]``; a one-line CourseError when it is missing or wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise C.CourseError(f"no {path.name} at {path.parent}: it says where the course is published "
                            "([repository] url = \"\" and branch = \"main\" when it is not yet)") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise C.CourseError(f"{path} does not read as TOML: {exc}") from None
    repo = data.get("repository")
    if not isinstance(repo, dict) or not isinstance(repo.get("url", ""), str) or not isinstance(repo.get("branch", "main"), str):
        raise C.CourseError(f"{path} needs a [repository] table with a url string and a branch string")
    url, branch = repo.get("url", "").strip(), repo.get("branch", "main").strip()
    if url and is_placeholder(url):
        raise C.CourseError(f"{path}: url {url!r} is a placeholder: write the course's git URL, or \"\" until it is published")
    if url and not url.startswith(URL_SCHEMES):
        raise C.CourseError(f"{path}: url {url!r} is not a git URL (one starting {', '.join(URL_SCHEMES)})")
    if re.search(r'[\s"\\]', url):
        raise C.CourseError(f"{path}: url {url!r} has a space, quote or backslash, which no git URL needs")
    if not re.fullmatch(r"[\w./-]+", branch):
        raise C.CourseError(f"{path}: branch {branch!r} is not a branch name")
    return Published(url, branch)


def stamp(nb: dict, pub: Published, where: str = "the notebook") -> dict:
    """``nb`` with ``pub`` written into its setup cell's ``REPO_URL`` and ``BRANCH`` lines."""
    cell = next((c for c in nb.get("cells", []) if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "setup"), None)
    if cell is None:
        raise C.CourseError(f"{where} has no cell with grade_id 'setup' for the release to write the course URL into")
    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    for key, pattern in SETTING_LINES.items():
        if len(pattern.findall(text)) != 1:
            raise C.CourseError(f"the setup cell of {where} needs exactly one line like {pattern.pattern[2:40]!r}... "
                                f"for the release to write the course's {key} into")
        text = pattern.sub(lambda m, v=getattr(pub, key): m.group(1) + json.dumps(v) + m.group(3), text)
    cell["source"] = text
    return nb


def links(pub: Published, names: list[str], notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """The README's "Open in Colab / Kaggle" section body (Markdown), or a line saying why there is none."""
    gh = pub.github
    if not pub.url:
        return ("The course's address is not set yet (`course.toml`), so there are no \"Open in Colab\" links: on Colab "
                "or Kaggle, upload the repository's zip and run the notebook's first cell (below).")
    if gh is None:
        return (f"The course is published at `{pub.url}` (`course.toml`), which is not on github.com, where Colab and "
                "Kaggle open notebooks from: clone it and upload the notebook, or upload the repository's zip.")
    rows = ["| lab | Colab | Kaggle |", "|---|---|---|"]
    for a in names:
        blob = f"github.com/{gh[0]}/{gh[1]}/blob/{pub.branch}/notebooks/{a}.ipynb"
        title = _title(notebooks_dir / f"{a}.ipynb") or a
        rows.append(f"| {title} | [![Open In Colab]({COLAB_BADGE})](https://colab.research.google.com/{blob.replace('github.com/', 'github/', 1)}) "
                    f"| [![Open In Kaggle]({KAGGLE_BADGE})](https://kaggle.com/kernels/welcome?src=https://{blob}) |")
    return "\n".join(rows)


def _title(path: Path) -> str:
    """The notebook's first Markdown heading, without the ``#``."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return ""
    for c in cells:
        text = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "markdown" and text.startswith("# "):
            return text.splitlines()[0][2:].strip()
    return ""


def with_links(readme_text: str, body: str, where: str = "README.md") -> str:
    """``readme_text`` with the part between :data:`LINKS_BEGIN` and :data:`LINKS_END` replaced by ``body``."""
    start, end = readme_text.find(LINKS_BEGIN), readme_text.find(LINKS_END)
    if start < 0 or end < start:
        raise C.CourseError(f"{where} has no {LINKS_BEGIN!r} ... {LINKS_END!r} section for the release to write links into")
    return readme_text[:start + len(LINKS_BEGIN)] + "\n" + body + "\n" + readme_text[end:]


def released_text(assignment: str, source_dir: Path = SOURCE_DIR, pub: Published | None = None) -> str:
    """The released notebook of ``assignment`` as the exact text written to notebooks/, with
    ``pub`` (default: ``course.toml``) in its setup cell."""
    pub = pub or published()
    C.notebook_name(assignment, source_dir)  # a clear error for a bad folder
    work = Path(tempfile.mkdtemp(prefix="gpulab-release-"))
    try:
        stamped = work / "source"
        shutil.copytree(source_dir / assignment, stamped / assignment)
        nb_path = stamped / assignment / f"{assignment}.ipynb"
        nb_path.write_text(json.dumps(stamp(json.loads(nb_path.read_text()), pub, str(source_dir / assignment)), indent=1))
        root = C.make_course(work / "course", assignment, stamped)
        nb = json.loads(C.released_path(root, assignment).read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for cell in nb["cells"]:  # no outputs, no execution counts, ever
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def release(check: bool = False, source_dir: Path = SOURCE_DIR, notebooks_dir: Path = NOTEBOOKS_DIR,
            readme: Path | None = README, course_file: Path = COURSE_FILE) -> list[str]:
    """Write (or with ``check`` compare) every released notebook and the README's links; returns
    the problems.

    Problems, one line each: a notebook that is missing or differs from a fresh release, a
    notebook in notebooks/ with no source, a README whose links are not the ones ``course.toml``
    gives. Writing returns the files written. ``readme=None`` leaves the README alone."""
    names = C.assignments(source_dir)
    if not names:
        raise C.CourseError(f"no assignments in {source_dir}")
    pub = published(course_file)
    out = []
    for a in names:
        text = released_text(a, source_dir, pub)
        dest = notebooks_dir / f"{a}.ipynb"
        if not check:
            notebooks_dir.mkdir(parents=True, exist_ok=True)
            if not dest.is_file() or dest.read_text() != text:
                dest.write_text(text)
                out.append(f"wrote {dest}")
            continue
        if not dest.is_file():
            out.append(f"{dest} is missing: run `python -m grader release`")
        else:
            try:
                same = json.loads(dest.read_text()) == json.loads(text)
            except json.JSONDecodeError:
                same = False
            if not same:
                out.append(f"{dest} is out of date with {source_dir / a}: run `python -m grader release`")
    if check and notebooks_dir.is_dir():
        for nb in sorted(notebooks_dir.glob("*.ipynb")):
            if nb.stem not in names:
                out.append(f"{nb} has no source in {source_dir} (delete it, or add grader/source/{nb.stem}/)")
    if readme is not None:
        text = readme.read_text(encoding="utf-8")
        fresh = with_links(text, links(pub, names, notebooks_dir), readme.name)
        if fresh != text:
            if check:
                out.append(f"{readme}'s Colab and Kaggle links are not the ones {course_file.name} gives: run `python -m grader release`")
            else:
                readme.write_text(fresh, encoding="utf-8")
                out.append(f"wrote {readme}")
    return out


def reference_submission(assignment: str, source_dir: Path = SOURCE_DIR, notebooks_dir: Path = NOTEBOOKS_DIR) -> dict:
    """The released notebook with the source's answers typed into its answer cells: what a
    learner who got everything right submits. Tests and the GPU check grade it."""
    released = json.loads((notebooks_dir / f"{assignment}.ipynb").read_text())
    source = json.loads((source_dir / assignment / f"{assignment}.ipynb").read_text())

    def gid(cell: dict):
        return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")

    answers = {gid(c): c["source"] for c in source["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    for cell in released["cells"]:
        if gid(cell) in answers:
            cell["source"] = answers[gid(cell)]
    return released
