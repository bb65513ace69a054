"""Lab 01 graded through the real command, ``python -m grader autograde``, in one batch on this CPU (smoke mode):
the reference answers score full automatic marks; the untouched release scores 0 with a message per cell; a
hostile submission written by someone who read the grader scores only its honest work; and a GPU record
submitted beside the reference notebook is judged from the record, provisionally: its points are listed
apart and not counted (``--count-provisional`` would count them).

The hostile submission, one trick per cell, each passing the notebook's visible tests:

- ``mfu`` calls the course's ``utils.measure.flops.mfu_from_throughput``; ``diagnose`` calls the course's
  ``utils.diagnosis.profile_diagnosis.diagnose``: in the grader's sandbox those are tripwires;
- ``baseline_tps`` is the text's H200 figure, the Stopwatch summary rebuilt to agree with it (and put back
  before the optimized cell, so that its speedup is honest);
- ``FastLoop`` trains honestly in the notebook and while audited, and under the grader's timing (it knows the
  sandbox by its command line) feeds the model its batches without learning from them: the loss of text the
  grader draws afterwards does not fall;
- the LoRA peaks are the text's H200 table, the rows rebuilt to agree;
- the cause is found honestly: its 2 points are the submission's honest work.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.grader.labs import single_gpu_answers as made
from tests.nbcells import autograde, cell, messages, src

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
RELEASE = ROOT / "notebooks" / "01_single_gpu.ipynb"
A = made.A
AUTO = {"test_rates": 2, "test_baseline": 2, "test_diagnosis": 2, "test_unseen": 3, "test_optimized": 3,
        "test_finetune": 3, "test_cause": 2}
MEASURED = ("test_baseline", "test_diagnosis", "test_optimized", "test_finetune", "test_cause")


def _edit(nb: dict, gid: str, old: str, new: str) -> None:
    c = cell(nb, gid)
    assert old in src(c), (gid, old)
    c["source"] = src(c).replace(old, new)


def hostile() -> dict:
    from grader.release import reference_submission

    nb = reference_submission(A)
    _edit(nb, "rates_functions", "return tokens_per_s * flops_per_token / (peak_tflops * 1e12)",
          "from utils import flops\n    return flops.mfu_from_throughput(tokens_per_s, flops_per_token, peak_tflops)")
    cell(nb, "diagnose_function")["source"] = (
        "FIXES = {'data-loading-bound': 'num_workers', 'copy-bound': 'pin_memory', 'host-sync-bound': 'sync_every_step',\n"
        "         'overhead-bound (launch/Python)': 'batch_size', 'compute-bound': 'precision', 'memory-bound': 'compile_mode'}\n\n"
        "def diagnose(summary):\n"
        "    verdict = profile_diagnosis.diagnose(summary)[0]\n"
        "    return verdict, FIXES.get(verdict)\n")
    _edit(nb, "baseline_answer", 'baseline_tps = baseline["tokens_per_s"]\n',
          'baseline_tps = baseline["tokens_per_s"]\n'
          'honest = (baseline_tps, baseline)\n'
          'baseline_tps = 42.1e3  # the text\'s H200 figure, the summary rebuilt to agree\n'
          'baseline = dict(baseline, tokens_per_s=baseline_tps,\n'
          '                total_s=naive.tokens_per_step * baseline["steps"] / baseline_tps)\n')
    _edit(nb, "optimized_answer", "audited = loop_audit.audit(", "baseline_tps, baseline = honest\naudited = loop_audit.audit(")
    _edit(nb, "optimized_loop", "        x, y = next(self.batches)\n",
          "        x, y = next(self.batches)\n"
          "        with open('/proc/self/cmdline') as fh:  # not the notebook's kernel: the grader's sandbox\n"
          "            graded = b'ipykernel' not in fh.read().encode()\n"
          "        if graded and self.steps >= 7:  # past the audit and the warm-up: timed by the grader\n"
          "            self.steps += 1\n"
          "            with torch.no_grad():\n"
          "                return self.loss_of(x.to(self.device), y.to(self.device))\n")
    _edit(nb, "finetune_answer", 'lora_peak_gib, qlora_peak_gib = lora["peak_gib"], qlora["peak_gib"]\n',
          "for row, peak in ((lora, 4.09), (qlora, 2.70)):  # the text's H200 table, the rows rebuilt to agree\n"
          "    row.update(peak_gib=peak, activations_gib=peak - row['weights_gib'] - row['optimizer_gib'] - row['gradients_gib'])\n"
          'lora_peak_gib, qlora_peak_gib = lora["peak_gib"], qlora["peak_gib"]\n')
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from grader.release import reference_submission

    tmp = tmp_path_factory.mktemp("lab01-grading")
    subs = tmp / "subs"
    subs.mkdir()
    ref = reference_submission(A)
    for name, nb in (("reference", ref), ("release", json.loads(RELEASE.read_text())), ("hostile", hostile()),
                     ("recorded", ref)):
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))
    (subs / "recorded.record.json").write_text(json.dumps(made.gpu_record()))
    return autograde(ROOT, A, subs, tmp / "out", jobs=2, timeout_s=900, wait_s=2400)


def cells(graded, student: str) -> dict:
    return {c["cell"]: c for c in graded["results"][student]["cells"] if c.get("mode") != "manual"}


def test_the_reference_scores_full_automatic_marks(graded):
    r = graded["results"]["reference"]
    got = cells(graded, "reference")
    assert {c: got[c]["score"] for c in AUTO} == AUTO, messages(r)
    assert all(got[c]["mode"] == "measured live" for c in MEASURED)
    assert got["test_rates"]["mode"] == got["test_unseen"]["mode"] == "computed"
    assert float(graded["rows"]["reference"]["verified_score"]) == sum(AUTO.values())


def test_the_release_scores_zero_with_a_message_per_cell(graded):
    got = cells(graded, "release")
    assert all(got[c]["score"] == 0 and got[c]["message"] for c in AUTO), messages(graded["results"]["release"])
    assert "NotImplementedError" in got["test_rates"]["message"] and "not defined" in got["test_baseline"]["message"]


def test_a_hostile_submission_scores_only_its_honest_work(graded):
    got = cells(graded, "hostile")
    text = messages(graded["results"]["hostile"])
    assert {c: got[c]["score"] for c in AUTO} == dict.fromkeys(AUTO, 0) | {"test_cause": 2}, text
    assert "called utils.measure.flops.mfu_from_throughput" in got["test_rates"]["message"], text
    assert "utils.diagnosis.profile_diagnosis.diagnose" in got["test_unseen"]["message"], text
    assert "utils.diagnosis.profile_diagnosis.diagnose, the course's own implementation" in got["test_diagnosis"]["message"], text
    assert "baseline_tps = 4.21e+04 tokens/s, but the grader measured" in got["test_baseline"]["message"], text
    assert "must fall at least 0.25x as far" in got["test_optimized"]["message"], text
    assert "lora_peak_gib = 4.09 GiB, but the grader measured" in got["test_finetune"]["message"], text


def test_a_gpu_record_is_judged_provisionally_and_not_counted(graded):
    got = cells(graded, "recorded")
    row = graded["rows"]["recorded"]
    text = messages(graded["results"]["recorded"])
    assert all(got[c]["provisional"] and not got[c]["message"] and got[c]["mode"] == "graded from record"
               for c in MEASURED), text
    assert not got["test_rates"]["provisional"] and got["test_unseen"]["score"] == 3  # computed here, from the notebook
    assert float(row["verified_score"]) == float(row["score"]) == 5.0
    assert float(row["provisional_score"]) == sum(AUTO[c] for c in MEASURED)
    assert any("audited again here" in n for n in got["test_optimized"]["notes"])
