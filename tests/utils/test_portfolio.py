"""``python -m utils.portfolio``: a lab's README from its measurement record and notebook.

Rendered for every lab's reference record: the smoke records of tests/data/records/ (each lab's
reference answers graded on a CPU, tests/data/records/README.md) and the GPU records under
benchmarks/results/. The rules checked on each README: every number in its text (the title
line aside) is one of the record's numbers as ``num`` prints it, or stands in a line quoted
verbatim from the notebook; every plot it links exists and is a PNG, and each figure kind is
either drawn or named as not drawn; a smoke record says so in its one line; bad input is one
line and exit status 2.
"""
from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from utils import portfolio
from utils.portfolio_format import num
from utils.portfolio_plots import KINDS

ROOT = Path(__file__).resolve().parents[2]
LABS = tuple(portfolio.SIGNATURES)
SMOKE_RECORDS = {lab: ROOT / "tests" / "data" / "records" / f"{lab}.record.json" for lab in LABS}
GPU_RECORDS = sorted(ROOT.glob("benchmarks/results/**/*.record.json"))
CASES = [(lab, p) for lab, p in SMOKE_RECORDS.items()] + [(p.name.removesuffix(".record.json"), p) for p in GPU_RECORDS]
IDS = [f"smoke-{lab}" for lab in LABS] + [str(p.relative_to(ROOT / "benchmarks" / "results").parent) for p in GPU_RECORDS]
# Numbers as the README prints them: digits with optional thousands groups, a fraction and an
# exponent, not glued to a word (``H200``, ``bf16``, ``01_single_gpu`` hold none).
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?(?!\w)(?!\.\d)")
LINK = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def reference_notebook(lab: str) -> dict:
    from grader.release import reference_submission

    return reference_submission(lab)


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory) -> dict[str, Path]:
    """Each lab's reference answers (the released notebook with the source's answers) on disk."""
    folder = tmp_path_factory.mktemp("notebooks")
    out = {}
    for lab in LABS:
        out[lab] = folder / f"{lab}.ipynb"
        out[lab].write_text(json.dumps(reference_notebook(lab)))
    return out


@pytest.fixture(scope="module")
def rendered(notebooks, tmp_path_factory) -> dict[str, tuple[str, Path, Path]]:
    """``{case id: (README text, its folder, the record)}`` for every reference record."""
    out = {}
    for (lab, record), cid in zip(CASES, IDS, strict=True):
        folder = tmp_path_factory.mktemp(cid.replace("/", "_"))
        readme = portfolio.build(notebooks[lab], folder, record)
        out[cid] = (readme.read_text(), folder, record)
    return out


# -- the rule: numbers come from the record --------------------------------------------------

def record_numbers(data: dict) -> set[str]:
    """Every number of the record as the README may print it: each numeric value through
    ``num``, and the digits that its strings and keys hold (a driver version, a model name)."""
    found: set[str] = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                found.update(NUMBER.findall(str(k)))
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            found.update(NUMBER.findall(x))
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
            found.update(NUMBER.findall(num(x)))

    walk(data)
    return found


def notebook_lines(nb: dict) -> set[str]:
    """Every line of every cell's source and saved text output, stripped."""
    lines = set()
    for c in nb["cells"]:
        texts = [c["source"] if isinstance(c["source"], str) else "".join(c["source"])]
        for o in c.get("outputs", []):
            t = o.get("text", "")
            texts.append(t if isinstance(t, str) else "".join(t))
        for t in texts:
            lines.update(ln.strip() for ln in t.splitlines())
    return lines


def quoted_and_own(readme: str) -> tuple[list[str], list[str]]:
    """(lines quoted from the notebook: blockquotes and fenced code; the README's own lines),
    the title line left out."""
    quoted, own, fence = [], [], None
    for line in readme.splitlines()[1:]:
        if fence:
            if line == fence:
                fence = None
            else:
                quoted.append(line)
        elif line.startswith(("```", "~~~~")):
            fence = line[:4] if line.startswith("~~~~") else "```"
        elif line.startswith(">"):
            quoted.append(line[1:].removeprefix(" "))
        else:
            own.append(line)
    return quoted, own


def invented(readme: str, record: dict, nb: dict) -> list[str]:
    """What breaks the rule: numbers of the README's own lines that the record does not hold,
    and quoted lines that are not the notebook's."""
    allowed = record_numbers(record)
    quoted, own = quoted_and_own(readme)
    bad = [f"{n!r} in {line!r}" for line in own for n in NUMBER.findall(line) if n not in allowed]
    nb_lines = notebook_lines(nb)
    bad += [f"quoted {q!r} is not the notebook's" for q in quoted if q.strip() and q.strip() not in nb_lines]
    return bad


@pytest.mark.parametrize(("lab", "record"), CASES, ids=IDS)
def test_every_number_is_the_records(rendered, lab, record):
    readme, _, _ = rendered[IDS[CASES.index((lab, record))]]
    bad = invented(readme, json.loads(record.read_text()), reference_notebook(lab))
    assert not bad, f"{len(bad)} numbers or quotes not from the record or notebook: {bad[:8]}"
    assert len(NUMBER.findall(readme)) > 20, "the README shows the record's numbers"


def test_the_check_catches_an_invented_number(rendered):
    """The rule above is a real check: a number the record does not hold, added to the
    README's text or left there after the record changed, is found."""
    cid = IDS[0]
    readme, _, record = rendered[cid]
    data, nb = json.loads(record.read_text()), reference_notebook(LABS[0])
    assert invented(readme + "\nThe speedup was 12.345 x.\n", data, nb) == ["'12.345' in 'The speedup was 12.345 x.'"]
    assert invented(readme + "\n> a quote the notebook does not hold\n", data, nb)
    changed = json.loads(record.read_text())
    name, m = next(iter(changed["measurements"].items()))
    m["value"] = m["value"] * 1.5 + 1
    assert any(num(data["measurements"][name]["value"]).split(",")[0] in b for b in invented(readme, changed, nb))


@pytest.mark.parametrize("v", [0.0, 1, 7, 12.5, 999.95, 1000.4, 48246.826, 16384, 2147483648, 0.6169340438, 0.0012345,
                               8.45987022442768e-08, -0.05, 3.59, 1e20, 123456.789])
def test_num_keeps_four_significant_digits(v):
    text = num(v)
    back = float(text.replace(",", ""))
    assert back == pytest.approx(v, rel=5e-4, abs=0.5 if abs(v) >= 1000 else 0), text
    if float(v).is_integer() and abs(v) < 1e15:
        assert back == v, f"whole numbers are printed in full: {text}"


def test_num_is_faithful_on_random_values():
    rng = random.Random(0)
    for _ in range(2000):
        v = rng.uniform(-1, 1) * 10 ** rng.uniform(-9, 9)
        back = float(num(v).replace(",", ""))
        assert back == pytest.approx(v, rel=5e-4, abs=0.5 if abs(v) >= 1000 else 0)


# -- plots -------------------------------------------------------------------------------------

EXPECTED_PLOTS = {  # the figures each lab's record has the data for (utils/portfolio_plots.py)
    "00_foundations": {"roofline"},
    "01_single_gpu": {"before_after", "memory_breakdown"},
    "02_multi_gpu": {"scaling"},
    "03_inference_serving": {"latency_throughput", "before_after"},
    "04_benchmarking_production": {"latency_throughput"},
    "05_hardware_and_cost": {"latency_throughput", "before_after"},
}


@pytest.mark.parametrize(("lab", "record"), CASES, ids=IDS)
def test_plots_are_pngs_and_the_missing_ones_say_why(rendered, lab, record):
    readme, folder, _ = rendered[IDS[CASES.index((lab, record))]]
    links = LINK.findall(readme)
    for link in links:
        path = folder / link
        assert path.is_file(), f"{link} is linked but not written"
        assert path.read_bytes()[:8] == PNG_MAGIC, f"{link} is not a PNG"
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(links), "every PNG written is linked"
    drawn = {Path(link).stem for link in links}
    assert EXPECTED_PLOTS.get(lab, set()) <= drawn, f"{lab}: expected {EXPECTED_PLOTS.get(lab)}, drew {drawn}"
    not_drawn = readme.split("Not drawn, for want of data in the record", 1)[-1] if len(drawn) < len(KINDS) else ""
    for kind, label in KINDS.items():
        assert (kind in drawn) != (f"- {label}: " in not_drawn), f"{kind} is either drawn or said not to be"


def test_no_plot_from_data_the_record_lacks(notebooks, tmp_path):
    """A record stripped of what a figure needs draws none of it, and says so."""
    data = json.loads(SMOKE_RECORDS["01_single_gpu"].read_text())
    for m in data["measurements"].values():
        m["extra"] = {k: v for k, v in m["extra"].items() if not k.endswith("_gib")}
    del data["measurements"]["baseline_tokens_per_s"]
    rec = tmp_path / "01_single_gpu.record.json"
    rec.write_text(json.dumps(data))
    readme = portfolio.build(notebooks["01_single_gpu"], tmp_path / "out", rec).read_text()
    assert not LINK.findall(readme) and not list((tmp_path / "out").glob("*.png"))
    assert "- memory breakdown: " in readme and "- before / after: " in readme


# -- the machine, the workloads, smoke --------------------------------------------------------

@pytest.mark.parametrize(("lab", "record"), CASES, ids=IDS)
def test_fingerprint_workloads_and_smoke_line(rendered, lab, record):
    readme, _, _ = rendered[IDS[CASES.index((lab, record))]]
    data = json.loads(record.read_text())
    fp = data["fingerprint"]
    rows = set(readme.splitlines())
    for key, label in portfolio.FINGERPRINT_ROWS:
        if fp.get(key) not in (None, "", []):
            value = ", ".join(map(num, fp[key])) if isinstance(fp[key], list) else num(fp[key])
            assert f"| {label} | {value} |" in rows, f"fingerprint {key} missing"
    workload_rows = {ln.split(" | ")[0].removeprefix("| "): ln for ln in readme.split("| measurement | workload |")[1]
                     .split("\n\n")[0].splitlines()[2:]}
    for name, m in data["measurements"].items():
        assert name in workload_rows, f"{name} has no workload row"
        for k, v in m["extra"].items():
            if k in portfolio.WORKLOAD_KEYS and isinstance(v, (str, int, float)) and not isinstance(v, bool):
                assert f"{k} {num(v)}" in workload_rows[name], f"{name}: workload {k} missing"
        assert f"| {name} | {num(m['value'])} | {m['unit']} |" in readme, f"{name} missing from the full list"
    smoke = fp.get("kind") != "gpu"
    assert (portfolio.SMOKE_LINE in readme) == smoke
    if smoke:
        assert readme.splitlines()[2] == portfolio.SMOKE_LINE, "the smoke line is at the top"
        assert readme.count(portfolio.SMOKE_LINE) == 1


def test_smoke_records_are_small_and_of_their_lab():
    for lab, path in SMOKE_RECORDS.items():
        assert path.stat().st_size < 64 * 1024, f"{path.name}: keep test data small"
        from utils.record import Record

        rec = Record.load(path)
        assert portfolio.record_lab(rec) == lab
        assert rec.fingerprint.get("kind") == "cpu"


# -- answers -----------------------------------------------------------------------------------

def _answer_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("lab", LABS)
def test_released_notebook_lists_every_answer_cell_as_not_answered(lab, tmp_path):
    nb_path = ROOT / "notebooks" / f"{lab}.ipynb"
    readme = portfolio.build(nb_path, tmp_path, SMOKE_RECORDS[lab]).read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("Not answered: "))
    for c in _answer_cells(json.loads(nb_path.read_text())):
        assert f"`{c['metadata']['nbgrader']['grade_id']}` ({c['cell_type']})" in line


def test_prose_and_string_answers_are_quoted_as_written(notebooks, tmp_path):
    nb = reference_notebook("00_foundations")
    prose = ("The matmul is compute-bound: 0.0939 TFLOP/s at intensity 42.7, near the roof.\n\n"
             "| kernel | mine |\n|---|---|\n| copy | 84.3 GB/s |")
    md = {"cell_type": "markdown", "metadata": {"nbgrader": {"solution": True, "grade_id": "reflection"}}, "source": prose}
    stub = {"cell_type": "markdown", "metadata": {"nbgrader": {"solution": True, "grade_id": "why_md"}},
            "source": "YOUR ANSWER HERE"}
    nb["cells"] += [md, stub]
    limiter = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "limiter_answer")
    limiter["source"] = 'LIMITER = "overhead"  # the fixed share is 0.68 of the step\n'
    limiter["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["MFU 10.1% -> overhead-bound\n"]}]
    path = tmp_path / "00_foundations.ipynb"
    path.write_text(json.dumps(nb))
    readme = portfolio.build(path, tmp_path / "out", SMOKE_RECORDS["00_foundations"]).read_text()
    assert "\n".join("> " + ln if ln else ">" for ln in prose.splitlines()) in readme
    assert 'LIMITER = "overhead"  # the fixed share is 0.68 of the step' in readme
    assert "> MFU 10.1% -> overhead-bound" in readme
    assert "- `LIMITER` as the run recorded it: overhead" in readme
    assert "Not answered: `why_md` (markdown)." in readme
    assert not invented(readme, json.loads(SMOKE_RECORDS["00_foundations"].read_text()), nb)


# -- bad input: one line, exit status 2 ------------------------------------------------------

def _run(capsys, *args: str) -> tuple[int, list[str]]:
    code = portfolio.main([str(a) for a in args])
    return code, capsys.readouterr().err.splitlines()


def test_bad_input_is_one_line(notebooks, tmp_path, capsys):
    out = tmp_path / "out"
    lab0 = notebooks["00_foundations"]
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    wrong_schema = tmp_path / "schema.json"
    wrong_schema.write_text(json.dumps({"schema": "other/1", "measurements": {}}))
    data = json.loads(SMOKE_RECORDS["00_foundations"].read_text())
    no_unit = tmp_path / "no_unit.json"
    no_unit.write_text(json.dumps({**data, "measurements": {"copy_gbs": {"name": "copy_gbs", "value": 1.0}}}))
    text_value = tmp_path / "text_value.json"
    text_value.write_text(json.dumps({**data, "measurements": {"copy_gbs": {**data["measurements"]["copy_gbs"], "value": "fast"}}}))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**data, "measurements": {}}))
    not_nb = tmp_path / "00_foundations_copy.ipynb"
    not_nb.write_text("[1, 2]")
    alone = tmp_path / "alone" / "00_foundations.ipynb"
    alone.parent.mkdir()
    alone.write_text(lab0.read_text())
    cases = {
        "no notebook at": (tmp_path / "missing.ipynb", "--record", SMOKE_RECORDS["00_foundations"]),
        "is not a notebook": (not_nb, "--record", SMOKE_RECORDS["00_foundations"]),
        "no measurement record beside": (alone,),
        "no measurement record at": (lab0, "--record", tmp_path / "missing.json"),
        "is not valid JSON": (lab0, "--record", bad_json),
        "not a measurement record (expected schema": (lab0, "--record", wrong_schema),
        "needs name, value and unit": (lab0, "--record", no_unit),
        "needs a number, a unit": (lab0, "--record", text_value),
        "holds no measurements": (lab0, "--record", empty),
    }
    for expect, args in cases.items():
        code, err = _run(capsys, *args, "--out", out)
        assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and expect in err[0], (expect, err)
    assert not out.exists(), "bad input writes nothing"


@pytest.mark.parametrize("lab", LABS)
def test_a_record_of_another_lab_is_refused(notebooks, tmp_path, capsys, lab):
    for other in LABS:
        if other == lab:
            continue
        code, err = _run(capsys, notebooks[lab], "--record", SMOKE_RECORDS[other], "--out", tmp_path / "out")
        assert code == 2 and len(err) == 1, err
        assert f"a record of lab {other}" in err[0] and f"is lab {lab}" in err[0], err[0]


def test_record_found_beside_the_notebook_and_the_command_line(notebooks, tmp_path):
    """The default record is ``<assignment>.record.json`` beside the notebook (else the smoke
    one); ``python -m utils.portfolio`` runs as a command, and refuses in one line."""
    nb = tmp_path / "work" / "00_foundations.ipynb"
    nb.parent.mkdir()
    nb.write_text(notebooks["00_foundations"].read_text())
    (nb.parent / "00_foundations.smoke.record.json").write_text(SMOKE_RECORDS["00_foundations"].read_text())
    proc = subprocess.run([sys.executable, "-m", "utils.portfolio", str(nb), "--out", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "`00_foundations.smoke.record.json`" in (tmp_path / "site" / "README.md").read_text()
    gpu = next(p for p in GPU_RECORDS if p.name.startswith("00_foundations"))
    (nb.parent / "00_foundations.record.json").write_text(gpu.read_text())
    readme = portfolio.build(nb, tmp_path / "site2")
    assert portfolio.SMOKE_LINE not in readme.read_text(), "the GPU record beside it comes first"
    proc = subprocess.run([sys.executable, "-m", "utils.portfolio", str(nb), "--record", str(SMOKE_RECORDS["01_single_gpu"]),
                           "--out", str(tmp_path / "site3")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
