#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests and for trying the class-grading scripts
# (deploy/slurm/): munged, slurmctld and slurmd from Debian's packages (.ci/install-services.sh
# installs them), configured here and started as daemons. Idempotent: a cluster already up is
# left as it is. Needs root (or sudo): Slurm's daemons read /etc/slurm and run jobs as their users.
# Usage: .ci/slurm-up.sh [--down]
set -euo pipefail
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ "${1:-}" = "--down" ]; then
  $SUDO pkill -x slurmd || true; $SUDO pkill -x slurmctld || true; $SUDO pkill -x munged || true
  exit 0
fi
for b in munged slurmctld slurmd sinfo; do
  command -v "$b" >/dev/null 2>&1 || { echo "slurm-up: $b not found; run .ci/install-services.sh first" >&2; exit 2; }
done
if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed|alloc"; then
  echo "slurm-up: already up: $(sinfo -h -o '%P %D %T')"; exit 0
fi
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 512 ))
$SUDO mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge
[ -s /etc/munge/munge.key ] || { $SUDO mkdir -p /etc/munge; $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
$SUDO chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
$SUDO chmod 0700 /etc/munge; $SUDO chmod 0400 /etc/munge/munge.key
# proctrack/linuxproc and task/none: no cgroups needed (containers and CI runners often lack a
# writable cgroup tree); one node, every core and the memory schedulable.
$SUDO tee /etc/slurm/slurm.conf >/dev/null <<CONF
ClusterName=gpulab
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
pgrep -x munged >/dev/null || $SUDO -u munge munged --force 2>/dev/null || $SUDO munged --force
pgrep -x slurmctld >/dev/null || $SUDO slurmctld
pgrep -x slurmd >/dev/null || $SUDO slurmd
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed|alloc"; then
    echo "slurm-up: $(sinfo -h -o '%P %D %T %c cpus')"; exit 0
  fi
  sleep 1
done
echo "slurm-up: the node did not come up in 60 s; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
exit 1
