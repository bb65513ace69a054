#!/usr/bin/env bash
# Services and tools the tests need beyond pip: Debian's Prometheus server and promtool
# (tests/test_deploy.py starts its own server on a loopback port). hadolint and
# kubernetes-validate come from requirements-dev.txt. Idempotent: skips what is there.
# Measured on this project's 2-core CI machine: about 16 s with the .deb files already in
# apt's cache (apt-get update included); a cold machine also downloads 22.5 MB.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  echo "install-services: $(prometheus --version 2>&1 | head -n1)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends prometheus
echo "install-services: $(prometheus --version 2>&1 | head -n1)"
