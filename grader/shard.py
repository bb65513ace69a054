"""A class graded in shards, and the shards merged back into one set of outputs.

``autograde --shard K/N`` grades the submissions whose position in the class (the order
``grader.submissions.find`` gives, which sorts by student) is K-1 modulo N, and writes
``shard.json`` beside its ``grades.csv``: the assignment, K, N, the class size and each graded
student's position. ``python -m grader merge OUT...`` reads those folders and writes one
``grades.csv``, ``results.json``, ``feedback/`` and ``autograded/``, in the class's order, the
same files an unsharded batch writes. It refuses a set of shards with one missing, one twice,
two of different classes or assignments, or a student graded twice. Hand-written because
nbgrader has no notion of shards: its ``autograde`` grades what it finds, one gradebook.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

MANIFEST = "shard.json"
SCHEMA = "gpulab.shard/1"


class ShardError(Exception):
    """A bad ``--shard`` value or a set of shard outputs that cannot be merged; one line."""


def parse(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``, 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ShardError(f"--shard {text!r}: expected K/N, e.g. 2/4 (the second of four shards)") from None
    if not 1 <= k <= n:
        raise ShardError(f"--shard {text}: K must be between 1 and N")
    return k, n


def select(items: list, k: int, n: int) -> list[tuple[int, object]]:
    """``(position, item)`` for the items of shard ``k`` of ``n``: every n-th, from the (k-1)-th."""
    return [(i, x) for i, x in enumerate(items) if i % n == k - 1]


def write_manifest(out: Path, assignment: str, k: int, n: int, class_size: int,
                   positions: dict[str, int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps({"schema": SCHEMA, "assignment": assignment, "shard": k, "of": n,
                                            "class_size": class_size, "positions": positions}, indent=1) + "\n")


def _read(folder: Path) -> dict:
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ShardError(f"{folder}: no such folder (pass the --out folder of each shard)")
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{folder}: no {MANIFEST}; is it the output of `autograde --shard K/N`?") from None
    except (OSError, ValueError) as e:
        raise ShardError(f"{path}: unreadable ({e})") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        raise ShardError(f"{path}: not a shard manifest")
    for name in ("grades.csv", "results.json"):
        if not (folder / name).is_file():
            raise ShardError(f"{folder}: no {name}; did that shard finish?")
    return m


def merge(folders: list[Path], dest: Path) -> dict:
    """Merge shard outputs into ``dest``; returns ``{"assignment", "shards", "students"}``."""
    if not folders:
        raise ShardError("merge needs the output folders of the shards")
    manifests = [(Path(f), _read(Path(f))) for f in folders]
    first = manifests[0][1]
    for folder, m in manifests:
        for key in ("assignment", "of", "class_size"):
            if m.get(key) != first.get(key):
                raise ShardError(f"{folder}: {key} {m.get(key)!r}, but {manifests[0][0]} has {first.get(key)!r}: "
                                 "shards of different batches")
    n = first["of"]
    seen: dict[int, Path] = {}
    for folder, m in manifests:
        if m["shard"] in seen:
            raise ShardError(f"shard {m['shard']}/{n} given twice: {seen[m['shard']]} and {folder}")
        seen[m["shard"]] = folder
    if missing := sorted(set(range(1, n + 1)) - set(seen)):
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{n}' for k in missing)} missing "
                         f"from the folders given")
    rows: dict[int, tuple[dict, dict, Path]] = {}
    header: list[str] | None = None
    for folder, m in manifests:
        results = {r["student_id"]: r for r in json.loads((folder / "results.json").read_text())}
        with open(folder / "grades.csv", newline="") as fh:
            reader = csv.DictReader(fh)
            header = header or reader.fieldnames
            for row in reader:
                sid = row["student_id"]
                pos = m["positions"].get(sid)
                if pos is None or sid not in results:
                    raise ShardError(f"{folder}: {sid} is in grades.csv but not in its {MANIFEST} or results.json")
                if pos in rows:
                    raise ShardError(f"{sid} graded in two shards: {rows[pos][2]} and {folder}")
                rows[pos] = (row, results[sid], folder)
    if len(rows) != first["class_size"]:
        raise ShardError(f"the shards hold {len(rows)} of the class's {first['class_size']} submissions")
    dest.mkdir(parents=True, exist_ok=True)
    ordered = [rows[p] for p in sorted(rows)]
    with open(dest / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerows(row for row, _, _ in ordered)
    (dest / "results.json").write_text(json.dumps([r for _, r, _ in ordered], indent=1, default=str))
    for row, _, folder in ordered:
        for kind in ("feedback", "autograded"):
            src = folder / kind / row["student_id"]
            if src.is_dir():
                shutil.copytree(src, dest / kind / row["student_id"], dirs_exist_ok=True)
    return {"assignment": first["assignment"], "shards": n, "students": len(ordered)}


# -- a sharded class on Kubernetes ------------------------------------------------------------------

COPIER_IMAGE = "busybox:1.36.1"  # has tar, which `kubectl cp` needs in the pod
CPUS_PER_SHARD = 2  # as deploy/slurm/grade-class.sh asks Slurm for (GPULAB_CPUS_PER_TASK), so a pod requests as many

# The shard's container: grades its share, then appends its exit status to status/shard-K (one line
# per try), which the merge reads. Kubernetes sets JOB_COMPLETION_INDEX (0-based) in an Indexed Job.
SHARD_SCRIPT = """\
k=$((JOB_COMPLETION_INDEX + 1))
out="$GPULAB_DATA/out/$GPULAB_ASSIGNMENT"
mkdir -p "$out/status"
if [ -z "$(ls -A "$GPULAB_DATA/submissions" 2>/dev/null)" ]; then
  echo "shard $k/$GPULAB_SHARDS: no class in $GPULAB_DATA/submissions: copy it in before resuming the Jobs" >&2
  rc=2
else
  "${GPULAB_PYTHON:-python}" -m grader autograde --assignment "$GPULAB_ASSIGNMENT" \\
    --submissions "$GPULAB_DATA/submissions" --out "$out/shard-$k" --shard "$k/$GPULAB_SHARDS" --quiet
  rc=$?
fi
echo "$rc" >> "$out/status/shard-$k"
exit "$rc"
"""

# The merge's container: waits until every shard succeeded or used all its tries; names the failed
# ones at once (exit 1), and those not finished after GPULAB_WAIT_S; else merges them all with
# `python -m grader merge`, which checks each shard's outputs (shard.json, grades.csv, results.json).
MERGE_SCRIPT = """\
out="$GPULAB_DATA/out/$GPULAB_ASSIGNMENT"
n=$GPULAB_SHARDS
waited=0
while :; do
  finished=0; failed=""; silent=""
  k=1
  while [ "$k" -le "$n" ]; do
    f="$out/status/shard-$k"
    if [ -f "$f" ] && grep -qx 0 "$f"; then
      finished=$((finished + 1))
    elif [ -f "$f" ] && [ "$(wc -l < "$f")" -ge "$GPULAB_TRIES" ]; then
      finished=$((finished + 1)); failed="$failed $k/$n (exit $(tail -n 1 "$f"))"
    else
      silent="$silent $k/$n"
    fi
    k=$((k + 1))
  done
  if [ -n "$failed" ]; then
    echo "merge: shard$failed failed after $GPULAB_TRIES tries: kubectl logs -l job-name=gpulab-grade,batch.kubernetes.io/job-completion-index=K-1 says why" >&2
    exit 1
  fi
  [ "$finished" -ge "$n" ] && break
  if [ "$waited" -ge "$GPULAB_WAIT_S" ]; then
    echo "merge: shard$silent not finished after $GPULAB_WAIT_S s (still pending or running, or its pod was lost: kubectl get pods -l job-name=gpulab-grade)" >&2
    exit 1
  fi
  sleep "$GPULAB_POLL_S"; waited=$((waited + GPULAB_POLL_S))
done
set --
k=1
while [ "$k" -le "$n" ]; do set -- "$@" "$out/shard-$k"; k=$((k + 1)); done
exec "${GPULAB_PYTHON:-python}" -m grader merge "$@" --out "$out/merged"
"""


def _block(text: str, indent: int) -> str:
    """``text`` indented by ``indent`` spaces (a negative ``indent`` takes that many away)."""
    lines = text.rstrip("\n").split("\n")
    if indent < 0:
        return "\n".join(line[-indent:] for line in lines) + "\n"
    return "\n".join(" " * indent + line if line else "" for line in lines)


def k8s_manifests(shards: int = 4, assignment: str = "00_foundations",
                  image: str = "registry.example.com/gpulab-grade:0.1.0", storage: str = "20Gi", cpus: int = CPUS_PER_SHARD,
                  memory: str = "32Gi", memory_limit: str = "64Gi", tries: int = 2, wait_h: float = 24.0,
                  poll_s: int = 30) -> str:
    """The Kubernetes manifests of a sharded class, as one YAML stream: the volume claim, a copier
    pod to load the class with ``kubectl cp``, the shards' Indexed Job and the merge Job, both created
    suspended (they start when the class is loaded and the instructor resumes them). ``shards`` is
    written everywhere it is needed from this one argument; ``tries`` is each shard's tries
    (``backoffLimitPerIndex`` is one less), which the merge counts; the merge gives up on a shard that
    never reported after ``wait_h`` hours (the Job's ``activeDeadlineSeconds`` is an hour more)."""
    import re

    if shards < 1 or tries < 1 or cpus < 1 or poll_s < 1 or wait_h <= 0:
        raise ShardError("k8s-manifest: --shards, --tries, --cpus and --poll-s must be at least 1, --wait-h above 0")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", assignment):
        raise ShardError(f"k8s-manifest: --assignment {assignment!r} is not an assignment id")
    wait_s = int(wait_h * 3600)
    env_common = (f'            - name: GPULAB_ASSIGNMENT\n              value: "{assignment}"\n'
                  f'            - name: GPULAB_SHARDS\n              value: "{shards}"\n'
                  f'            - name: GPULAB_DATA\n              value: "/data"\n')
    security = _block("securityContext:\n  runAsNonRoot: true\n  runAsUser: 10001\n  runAsGroup: 10001\n"
                      "  fsGroup: 10001", 6) + "\n"  # every pod runs as the grade image's user
    data_volume = ("        - name: data\n          persistentVolumeClaim:\n            claimName: gpulab-grading\n")
    return f"""\
# A class graded on Kubernetes: {shards} shards, one pod and one GPU each, then one merge.
# Generated by: python -m grader k8s-manifest --shards {shards} --assignment {assignment} --image {image}
# (grader/shard.py, k8s_manifests; regenerate rather than edit: the shard count is written in
# several places below, from that one argument). Steps (deploy/README.md, "Grading a class"):
#   kubectl apply -f THIS_FILE
#   kubectl wait --for=condition=Ready pod/gpulab-grading-copier
#   kubectl cp SUBMISSIONS gpulab-grading-copier:/data/submissions
#   kubectl patch job gpulab-grade --type merge -p '{{"spec":{{"suspend":false}}}}'
#   kubectl patch job gpulab-grade-merge --type merge -p '{{"spec":{{"suspend":false}}}}'
#   results: /data/out/{assignment}/merged/ (kubectl cp gpulab-grading-copier:/data/out/{assignment}/merged OUT)
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: gpulab-grading
  labels:
    app.kubernetes.io/name: gpulab-grading
spec:
  accessModes: ["ReadWriteMany"]
  resources:
    requests:
      storage: {storage}
---
# Loads the class into the volume (kubectl cp needs tar in the pod) and reads the results back.
apiVersion: v1
kind: Pod
metadata:
  name: gpulab-grading-copier
  labels:
    app.kubernetes.io/name: gpulab-grading
    app.kubernetes.io/component: copier
spec:
{_block(security, -4)}  containers:
    - name: copier
      image: {COPIER_IMAGE}
      command: ["sh", "-c", "while :; do sleep 3600; done"]
      resources:
        requests:
          cpu: 100m
          memory: 64Mi
        limits:
          memory: 256Mi
      volumeMounts:
        - name: data
          mountPath: /data
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: gpulab-grading
---
apiVersion: batch/v1
kind: Job
metadata:
  name: gpulab-grade
  labels:
    app.kubernetes.io/name: gpulab-grading
    app.kubernetes.io/component: shard
spec:
  suspend: true  # resumed once the class is in /data/submissions
  completionMode: Indexed
  completions: {shards}
  parallelism: {shards}
  backoffLimitPerIndex: {tries - 1}  # each shard gets {tries} tries; the others go on
  maxFailedIndexes: {shards}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: gpulab-grading
        app.kubernetes.io/component: shard
    spec:
      restartPolicy: Never
{security}      containers:
        - name: grade
          image: {image}
          env:
{env_common}          command: ["sh", "-c"]
          args:
            - |
{_block(SHARD_SCRIPT, 14)}
          resources:
            limits:
              nvidia.com/gpu: 1
              memory: {memory_limit}
            requests:
              cpu: "{cpus}"
              memory: {memory}
          volumeMounts:
            - name: data
              mountPath: /data
            - name: shm
              mountPath: /dev/shm
      volumes:
{data_volume}        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: 8Gi
---
apiVersion: batch/v1
kind: Job
metadata:
  name: gpulab-grade-merge
  labels:
    app.kubernetes.io/name: gpulab-grading
    app.kubernetes.io/component: merge
spec:
  suspend: true  # resumed with the shards
  backoffLimit: 0  # a merge that failed names the shard; trying again would say the same
  activeDeadlineSeconds: {wait_s + 3600}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: gpulab-grading
        app.kubernetes.io/component: merge
    spec:
      restartPolicy: Never
{security}      containers:
        - name: merge
          image: {image}
          env:
{env_common}            - name: GPULAB_TRIES
              value: "{tries}"
            - name: GPULAB_WAIT_S
              value: "{wait_s}"
            - name: GPULAB_POLL_S
              value: "{poll_s}"
          command: ["sh", "-c"]
          args:
            - |
{_block(MERGE_SCRIPT, 14)}
          resources:
            requests:
              cpu: "1"
              memory: 2Gi
            limits:
              memory: 4Gi
          volumeMounts:
            - name: data
              mountPath: /data
      volumes:
{data_volume}"""
