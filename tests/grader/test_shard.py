"""grader/shard.py: which submissions a shard takes, and merging shard outputs back into what
one batch writes; every way a set of shards can be wrong gets its own one-line error."""
from __future__ import annotations

import csv
import json

import pytest

from grader import shard
from grader.batch import CSV_COLUMNS


@pytest.mark.parametrize("text, want", [("1/1", (1, 1)), ("2/4", (2, 4)), ("4/4", (4, 4))])
def test_parse(text, want):
    assert shard.parse(text) == want


@pytest.mark.parametrize("text", ["0/4", "5/4", "2", "a/b", "2/4/1", "-1/3", ""])
def test_parse_refuses(text):
    with pytest.raises(shard.ShardError, match="--shard"):
        shard.parse(text)


@pytest.mark.parametrize("size, n", [(0, 1), (1, 3), (7, 3), (10, 10), (200, 8)])
def test_shards_cover_the_class_once(size, n):
    items = [f"s{i:03d}" for i in range(size)]
    taken = [pos for k in range(1, n + 1) for pos, _ in shard.select(items, k, n)]
    assert sorted(taken) == list(range(size))
    sizes = [len(shard.select(items, k, n)) for k in range(1, n + 1)]
    assert max(sizes) - min(sizes) <= 1  # balanced


def _batch(folder, assignment, students, positions=None, k=1, n=1, class_size=None):
    """A batch output as grader/batch.py writes it, with a manifest when ``positions``."""
    folder.mkdir(parents=True)
    with open(folder / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for s in students:
            w.writerow({c: "" for c in CSV_COLUMNS} | {"assignment": assignment, "student_id": s, "score": len(s),
                                                     "max_score": 15, "status": "ok"})
    (folder / "results.json").write_text(json.dumps([{"student_id": s, "score": len(s)} for s in students]))
    for s in students:
        (folder / "feedback" / s).mkdir(parents=True)
        (folder / "feedback" / s / f"{assignment}.html").write_text(f"<p>{s}</p>")
    if positions is not None:
        shard.write_manifest(folder, assignment, k, n, class_size, positions)


def _class(tmp_path, students, n):
    folders = []
    for k in range(1, n + 1):
        part = shard.select(students, k, n)
        f = tmp_path / f"shard{k}"
        _batch(f, "00_foundations", [s for _, s in part], {s: p for p, s in part}, k, n, len(students))
        folders.append(f)
    return folders


def test_merged_shards_equal_the_unsharded_batch(tmp_path):
    students = ["ana", "bo", "cy", "dee", "ed", "flo", "gus"]
    _batch(tmp_path / "whole", "00_foundations", students)
    folders = _class(tmp_path, students, 3)
    summary = shard.merge(list(reversed(folders)), tmp_path / "merged")
    assert summary == {"assignment": "00_foundations", "shards": 3, "students": 7}
    merged, whole = tmp_path / "merged", tmp_path / "whole"
    assert (merged / "grades.csv").read_text() == (whole / "grades.csv").read_text()
    assert json.loads((merged / "results.json").read_text()) == json.loads((whole / "results.json").read_text())
    assert sorted(p.name for p in (tmp_path / "merged" / "feedback").iterdir()) == sorted(students)


def test_merge_refuses_a_missing_shard(tmp_path):
    folders = _class(tmp_path, ["a", "b", "c", "d"], 3)
    with pytest.raises(shard.ShardError, match="shard 2/3 missing"):
        shard.merge([folders[0], folders[2]], tmp_path / "m")


def test_merge_refuses_a_shard_twice(tmp_path):
    folders = _class(tmp_path, ["a", "b", "c", "d"], 2)
    with pytest.raises(shard.ShardError, match="shard 1/2 given twice"):
        shard.merge([folders[0], folders[0], folders[1]], tmp_path / "m")


def test_merge_refuses_shards_of_different_batches(tmp_path):
    a = _class(tmp_path / "a", ["a", "b", "c"], 2)
    b = _class(tmp_path / "b", ["a", "b", "c", "d"], 2)
    with pytest.raises(shard.ShardError, match="class_size .* different batches"):
        shard.merge([a[0], b[1]], tmp_path / "m")


def test_merge_refuses_a_student_graded_twice(tmp_path):
    _batch(tmp_path / "s1", "00_foundations", ["a", "b"], {"a": 0, "b": 1}, 1, 2, 2)
    _batch(tmp_path / "s2", "00_foundations", ["b"], {"b": 1}, 2, 2, 2)
    with pytest.raises(shard.ShardError, match="b graded in two shards"):
        shard.merge([tmp_path / "s1", tmp_path / "s2"], tmp_path / "m")


@pytest.mark.parametrize("breakage, message", [
    ("no-manifest", "no shard.json"), ("no-grades", "no grades.csv"), ("bad-json", "unreadable"),
    ("not-a-folder", "no such folder"), ("foreign", "not a shard manifest"),
])
def test_merge_refuses_what_is_not_a_finished_shard(tmp_path, breakage, message):
    folders = _class(tmp_path, ["a", "b"], 2)
    f = folders[1]
    if breakage == "no-manifest":
        (f / shard.MANIFEST).unlink()
    elif breakage == "no-grades":
        (f / "grades.csv").unlink()
    elif breakage == "bad-json":
        (f / shard.MANIFEST).write_text("{")
    elif breakage == "not-a-folder":
        f = tmp_path / "nowhere"
    else:
        (f / shard.MANIFEST).write_text(json.dumps({"schema": "other"}))
    with pytest.raises(shard.ShardError, match=message):
        shard.merge([folders[0], f], tmp_path / "m")


# -- the Kubernetes manifests of a sharded class (grader/shard.py, k8s_manifests) ---------------------------

def _docs(text: str) -> dict[str, dict]:
    import yaml

    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text) if d}


@pytest.mark.parametrize("n", [1, 3, 16])
def test_k8s_manifests_write_the_shard_count_from_one_argument(n):
    docs = _docs(shard.k8s_manifests(shards=n, assignment="01_single_gpu", image="reg.example/g:1", tries=3))
    job, merge = docs["gpulab-grade"]["spec"], docs["gpulab-grade-merge"]["spec"]
    env = {e["name"]: e["value"] for e in job["template"]["spec"]["containers"][0]["env"]}
    menv = {e["name"]: e["value"] for e in merge["template"]["spec"]["containers"][0]["env"]}
    assert job["completions"] == job["parallelism"] == job["maxFailedIndexes"] == int(env["GPULAB_SHARDS"]) == n
    assert menv["GPULAB_SHARDS"] == str(n) and menv["GPULAB_ASSIGNMENT"] == env["GPULAB_ASSIGNMENT"] == "01_single_gpu"
    assert job["backoffLimitPerIndex"] + 1 == int(menv["GPULAB_TRIES"]) == 3  # the merge counts the same tries
    assert job["suspend"] is True and merge["suspend"] is True  # nothing runs before the class is loaded
    assert merge["backoffLimit"] == 0 and merge["activeDeadlineSeconds"] == int(menv["GPULAB_WAIT_S"]) + 3600
    images = {c["image"] for d in (job, merge) for c in d["template"]["spec"]["containers"]}
    assert images == {"reg.example/g:1"}
    copier = docs["gpulab-grading-copier"]["spec"]
    claims = {v["persistentVolumeClaim"]["claimName"] for spec in (job["template"]["spec"], merge["template"]["spec"],
                                                                   copier) for v in spec["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"gpulab-grading"}


def test_k8s_manifests_ask_for_the_cpus_slurm_asks_for():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    docs = _docs(shard.k8s_manifests())
    shard_cpu = docs["gpulab-grade"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    merge_cpu = docs["gpulab-grade-merge"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    slurm = (root / "deploy" / "slurm")
    assert f"cpus=${{GPULAB_CPUS_PER_TASK:-{shard_cpu}}}" in (slurm / "grade-class.sh").read_text()
    assert f"#SBATCH --cpus-per-task={shard_cpu}\n" in (slurm / "grade-shard.sbatch").read_text()
    assert f"#SBATCH --cpus-per-task={merge_cpu}\n" in (slurm / "merge.sbatch").read_text()
    assert int(shard_cpu) == shard.CPUS_PER_SHARD


@pytest.mark.parametrize("kwargs, message", [
    ({"shards": 0}, "at least 1"), ({"tries": 0}, "at least 1"), ({"cpus": 0}, "at least 1"),
    ({"wait_h": 0}, "above 0"), ({"assignment": "a b; rm -rf /"}, "not an assignment id"),
])
def test_k8s_manifests_refuse_bad_values(kwargs, message):
    with pytest.raises(shard.ShardError, match=message):
        shard.k8s_manifests(**kwargs)
