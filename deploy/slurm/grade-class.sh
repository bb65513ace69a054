#!/usr/bin/env bash
# Grade a class on Slurm: a job array with one task per shard (one GPU each), then a merge job
# that runs once every task has ended and writes OUT/merged/{grades.csv,results.json,feedback/}.
# Usage (from the course root, on a login node):
#   deploy/slurm/grade-class.sh ASSIGNMENT SUBMISSIONS OUT SHARDS
# Environment:
#   GPULAB_PYTHON        interpreter with the course's requirements (default: python3)
#   GPULAB_GPUS_PER_TASK GPUs per array task (default 1; 0 grades on CPUs, in smoke mode)
#   GPULAB_CPUS_PER_TASK CPUs per array task (default 2: the notebook's kernel and the grader beside it;
#                        the Kubernetes pods request as many, python -m grader k8s-manifest --cpus)
#   GPULAB_SBATCH_ARGS   extra sbatch options for both jobs, e.g. "--partition gpu --time 4:00:00"
# The merge job depends on the array with afterany: when a shard fails, merge still runs and
# names the missing shard instead of waiting forever.
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 ASSIGNMENT SUBMISSIONS OUT SHARDS" >&2; exit 2
fi
assignment=$1; submissions=$(realpath "$2"); out=$(realpath -m "$3"); shards=$4
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -d "$submissions" ] || { echo "grade-class: $submissions is not a folder of submissions" >&2; exit 2; }
case $shards in ''|*[!0-9]*|0) echo "grade-class: SHARDS must be a positive whole number" >&2; exit 2;; esac
command -v sbatch >/dev/null || { echo "grade-class: sbatch not found: run this on a Slurm login node" >&2; exit 2; }
gpus=${GPULAB_GPUS_PER_TASK:-1}
cpus=${GPULAB_CPUS_PER_TASK:-2}
case $cpus in ''|*[!0-9]*|0) echo "grade-class: GPULAB_CPUS_PER_TASK must be a positive whole number" >&2; exit 2;; esac
gres=(); [ "$gpus" -gt 0 ] && gres=(--gres "gpu:$gpus")
mkdir -p "$out/logs"
export GPULAB_PYTHON=${GPULAB_PYTHON:-python3} GPULAB_ASSIGNMENT=$assignment GPULAB_SUBMISSIONS=$submissions \
       GPULAB_OUT=$out GPULAB_SHARDS=$shards
# shellcheck disable=SC2086
array=$(sbatch --parsable --job-name "grade-$assignment" --array "1-$shards" "${gres[@]}" --cpus-per-task "$cpus" --chdir "$root" \
        --output "$out/logs/shard-%a.log" --export ALL ${GPULAB_SBATCH_ARGS:-} "$root/deploy/slurm/grade-shard.sbatch")
# shellcheck disable=SC2086
merge=$(sbatch --parsable --job-name "merge-$assignment" --dependency "afterany:${array%%;*}" --chdir "$root" \
        --output "$out/logs/merge.log" --export ALL ${GPULAB_SBATCH_ARGS:-} "$root/deploy/slurm/merge.sbatch")
echo "grade-class: shards in job array $array, merge in job $merge; results in $out/merged"
