#!/usr/bin/env bash
# Runs the GPU checks and benchmarks unattended and writes their results to $1 (default out/).
# Usage (on a CUDA machine, from the repo root): bash benchmarks/run_gpu.sh OUTDIR [STEP...]
# Steps: device monitor timing profiling exporter models grader allreduce multigpu
# (default: the first six).
# Each step's JSON lands in OUTDIR; everything printed goes to OUTDIR/log.txt as well.
set -uo pipefail
out=${1:-out}; shift || true
steps=${*:-device monitor timing profiling exporter models}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log="$out/log.txt"
run() { echo "=== $(date -u +%FT%TZ) $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log"; echo "=== rc=${PIPESTATUS[0]}" | tee -a "$log"; }
for step in $steps; do
  case $step in
    device) run nvidia-smi; run python -m utils --json; python -m utils --json > "$out/device.json" ;;
    monitor) run python benchmarks/monitor_overhead.py --out "$out/monitor_overhead.json" ;;
    timing) run python benchmarks/timing_agreement.py --out "$out/timing_agreement.json" ;;
    profiling) run python benchmarks/profiling_check.py --out "$out/profiling_check.json" --traces /tmp/profiling_traces ;;
    exporter)
      python -c "import torch,time
a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16); t=time.time()
while time.time()-t<15: a@a
torch.cuda.synchronize()" & load=$!
      sleep 5; run python -m utils.exporter --dump-json "$out/exporter.json" --interval-s 2; wait $load ;;
    models) run python -m pytest -m gpu -q -rs -p no:cacheprovider tests/ ;;
    grader) run python -m grader check notebooks/00_foundations.ipynb --json-out "$out/grader_check.json" ;;
    allreduce) n=$(python -c "import torch; print(torch.cuda.device_count())")
      run torchrun --standalone --nproc_per_node "$n" benchmarks/allreduce.py --out "$out/allreduce.json" ;;
    multigpu) n=$(python -c "import torch; print(torch.cuda.device_count())"); cfg=benchmarks/accelerate
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_ddp_1gpu.json" --bf16 --compile
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_${n}gpu.json" --bf16 --compile --measure-comm --baseline "$out/p2_ddp_1gpu.json"
      run accelerate launch --config_file $cfg/fsdp_full_shard.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_fsdp_${n}gpu.json" --bf16 --compile --baseline "$out/p2_ddp_1gpu.json" ;;
    *) echo "unknown step $step" | tee -a "$log" ;;
  esac
done
