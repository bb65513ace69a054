#!/usr/bin/env bash
# Runs the GPU checks and benchmarks unattended and writes their results to $1 (default out/).
# Usage (on a CUDA machine, from the repo root): bash benchmarks/run_gpu.sh OUTDIR [STEP...]
# Steps: device monitor timing profiling exporter models grader allreduce multigpu breaks accum
#        trl fused phase3 decode serving vllmbench t4 t4:ASSIGNMENT scaling (1 to 8 GPUs) lab:ASSIGNMENT (the reference answers of that lab graded live
#        here, e.g. lab:02_multi_gpu; python -m grader.gpu_check --live-only)
# (default: the first six). Needs nbgrader for grader and lab:*; bitsandbytes where a lab quantizes.
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
      sleep 5; run python -m utils.production.exporter --dump-json "$out/exporter.json" --interval-s 2; wait $load ;;
    models) run python -m pytest -m gpu -q -rs -p no:cacheprovider tests/ ;;
    grader) run python -m grader check notebooks/00_foundations.ipynb --json-out "$out/grader_check.json" ;;
    allreduce) n=$(python -c "import torch; print(torch.cuda.device_count())")
      run torchrun --standalone --nproc_per_node "$n" benchmarks/allreduce.py --out "$out/allreduce.json" ;;
    multigpu) n=$(python -c "import torch; print(torch.cuda.device_count())"); cfg=benchmarks/accelerate
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_ddp_1gpu.json" --bf16 --compile
      # the same step with the loss scope: a module returning only the loss is compiled (the logits stay inside the graph)
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_scope_loss_1gpu.json" --bf16 --compile --compile-scope loss
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_${n}gpu.json" --bf16 --compile --measure-comm --baseline "$out/p2_ddp_1gpu.json"
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b200_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --bucket-view --baseline "$out/p2_ddp_1gpu.json"
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b200_bf16hook_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --bucket-view --comm-hook bf16 --baseline "$out/p2_ddp_1gpu.json"
      # smaller buckets: the last one (tied embedding + first blocks, ready only at the backward's end) is exposed
      for b in 50 100; do
        run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b${b}_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb $b --bucket-view --baseline "$out/p2_ddp_1gpu.json"
      done
      # one compiled graph, all-reduce after the backward: no DDPOptimizer graph breaks, no overlap
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b200_noopt_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --bucket-view --ddp-optimizer no_optimization --baseline "$out/p2_ddp_1gpu.json"
      # fewer NCCL CTAs (SMs) for the overlapped all-reduce: less contention with the backward's kernels
      for c in 4 8 16; do
        NCCL_MAX_CTAS=$c run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b200_ctas${c}_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --bucket-view --baseline "$out/p2_ddp_1gpu.json"
        NCCL_MAX_CTAS=$c run torchrun --standalone --nproc_per_node "$n" benchmarks/allreduce.py --out "$out/allreduce_ctas${c}.json"
      done
      # DDP's own cost with no link: one process in DDP over a one-rank group, against the plain 1-GPU run
      run python benchmarks/train_multi_gpu.py --out "$out/p2_ddp1_b100_1gpu.json" --bf16 --compile --ddp-one-process --measure-comm --bucket-mb 100 --bucket-view --baseline "$out/p2_ddp_1gpu.json"
      # headroom: DDP's reducer with PyTorch's noop_hook (nothing crosses the link; the replicas drift apart)
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b100_noop_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 100 --bucket-view --comm-hook noop --baseline "$out/p2_ddp_1gpu.json"
      # NCCL's CTA efficiency policy (NCCL 2.27+): as few CTAs as still give decent bandwidth, for overlap
      NCCL_CTA_POLICY=1 run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b100_ctapolicy_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 100 --bucket-view --baseline "$out/p2_ddp_1gpu.json"
      # the loss scope inside DDP (only the loss leaves the compiled graph), against itself on one GPU
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_scope_loss_b100_${n}gpu.json" --bf16 --compile --compile-scope loss --measure-comm --bucket-mb 100 --bucket-view --baseline "$out/p2_scope_loss_1gpu.json"
      # NCCL on a high-priority CUDA stream: its blocks go first when the backward's kernels leave SMs free
      TORCH_NCCL_HIGH_PRIORITY=1 run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b100_hiprio_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 100 --bucket-view --baseline "$out/p2_ddp_1gpu.json"
      # one hardware queue for all streams: kernels start in issue order, so a bucket's all-reduce is not
      # held back behind backward kernels issued after it (Megatron sets this for its overlapped communication)
      CUDA_DEVICE_MAX_CONNECTIONS=1 run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_b100_maxconn1_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 100 --bucket-view --baseline "$out/p2_ddp_1gpu.json"
      # Compiled Autograd traces the all-reduces into the compiled backward (no graph breaks, overlap kept)
      # (against Compiled Autograd on one GPU: it alone made the 1-GPU step 13% faster, RESULTS.md)
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_pyred_1gpu.json" --bf16 --compile --ddp-optimizer python_reducer
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_pyred_${n}gpu.json" --bf16 --compile --measure-comm --ddp-optimizer python_reducer --baseline "$out/p2_pyred_1gpu.json"
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_pyred_b200_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --ddp-optimizer python_reducer --baseline "$out/p2_pyred_1gpu.json"
      # its all-reduces ran after the backward (0% overlap in a profile): let Inductor move them among the kernels
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_pyred_b200_reorder_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --ddp-optimizer python_reducer --comm-reorder passes --profile "$out/prof_pyred_reorder" --baseline "$out/p2_pyred_1gpu.json"
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_ddp_pyred_b200_overlap_${n}gpu.json" --bf16 --compile --measure-comm --bucket-mb 200 --ddp-optimizer python_reducer --comm-reorder overlap --profile "$out/prof_pyred_overlap" --baseline "$out/p2_pyred_1gpu.json"
      # DeepSpeed ZeRO where installed, eager (the engine holds bf16 weights with fp32 masters: against ZeRO on one GPU)
      if python -c "import deepspeed" 2>/dev/null; then
        for z in 1 2 3; do
          run accelerate launch --config_file $cfg/deepspeed_zero$z.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_zero${z}_1gpu.json" --bf16
          run accelerate launch --config_file $cfg/deepspeed_zero$z.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_zero${z}_${n}gpu.json" --bf16 --baseline "$out/p2_zero${z}_1gpu.json"
        done
      else echo "deepspeed not installed: ZeRO runs skipped (pip install deepspeed)" | tee -a "$out/skipped.txt"; fi
      # compiled FSDP against compiled FSDP on one GPU (bf16 weights under Accelerate's policy, see below)
      for v in fsdp fsdp2; do
        run accelerate launch --config_file $cfg/${v}_full_shard.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_${v}_1gpu.json" --bf16 --compile
        run accelerate launch --config_file $cfg/${v}_full_shard.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_${v}_${n}gpu.json" --bf16 --compile --baseline "$out/p2_${v}_1gpu.json"
      done
      # eager FSDP against eager FSDP on one GPU: with --bf16 FSDP computes on bf16 parameter copies, so a
      # 1-GPU autocast run (more casts per step) is not its like (FSDP2 scored 110% against one, RESULTS.md)
      run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_eager_1gpu.json" --bf16
      for v in fsdp fsdp2; do
        run accelerate launch --config_file $cfg/${v}_full_shard.yaml --num_processes 1 benchmarks/train_multi_gpu.py --out "$out/p2_${v}_eager_1gpu.json" --bf16
        run accelerate launch --config_file $cfg/${v}_full_shard.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_${v}_eager_${n}gpu.json" --bf16 --baseline "$out/p2_${v}_eager_1gpu.json"
      done
      run accelerate launch --config_file $cfg/fsdp_shard_grad_op.yaml --num_processes "$n" benchmarks/train_multi_gpu.py --out "$out/p2_fsdp_sgo_${n}gpu.json" --bf16 --compile --baseline "$out/p2_fsdp_1gpu.json" ;;
    breaks) # where scaling breaks, eager bf16 (each against a 1-GPU run of the same shape)
      n=$(python -c "import torch; print(torch.cuda.device_count())"); cfg=benchmarks/accelerate; t=benchmarks/train_multi_gpu.py
      al() { np=$1; shift; run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$np" $t --bf16 "$@"; }
      al 1 --out "$out/p2b_eager_1gpu.json"
      al "$n" --out "$out/p2b_eager_${n}gpu.json" --measure-comm --baseline "$out/p2b_eager_1gpu.json"
      export NCCL_P2P_DISABLE=1  # traffic through host memory, as between GPUs without NVLink or P2P
      al "$n" --out "$out/p2b_p2p_off_${n}gpu.json" --measure-comm --baseline "$out/p2b_eager_1gpu.json"
      run torchrun --standalone --nproc_per_node "$n" benchmarks/allreduce.py --out "$out/allreduce_p2p_off.json"
      unset NCCL_P2P_DISABLE
      al 1 --out "$out/p2b_small_1gpu.json" --batch-per-device 1
      al "$n" --out "$out/p2b_small_${n}gpu.json" --batch-per-device 1 --measure-comm --baseline "$out/p2b_small_1gpu.json"
 ;;
    accum) # accumulation over 4 micro-batches, all-reduce once (no_sync) vs on every micro-batch, eager bf16
      n=$(python -c "import torch; print(torch.cuda.device_count())"); cfg=benchmarks/accelerate; t=benchmarks/train_multi_gpu.py
      al() { np=$1; shift; run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$np" $t --bf16 "$@"; }
      a="--batch-per-device 4 --grad-accum 4 --steps 20"
      al 1 --out "$out/p2b_accum_1gpu.json" $a
      al "$n" --out "$out/p2b_accum_syncall_${n}gpu.json" $a --no-sync-accum --baseline "$out/p2b_accum_1gpu.json"
      al "$n" --out "$out/p2b_accum_nosync_${n}gpu.json" $a --baseline "$out/p2b_accum_1gpu.json" ;;
    scaling) # 1, 2, 4, 8 GPUs (as many as there are): all-reduce, eager and compiled DDP, eager FSDP2 full shard
      n=$(python -c "import torch; print(torch.cuda.device_count())"); cfg=benchmarks/accelerate; t=benchmarks/train_multi_gpu.py
      for k in 1 2 4 8; do
        [ "$k" -le "$n" ] || break
        if [ "$k" -eq 1 ]; then
          run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 $t --bf16 --out "$out/sc_eager_1gpu.json"
          run accelerate launch --config_file $cfg/ddp.yaml --num_processes 1 $t --bf16 --compile --out "$out/sc_compiled_1gpu.json"
          # FSDP's own 1-GPU point: with --bf16 it computes on bf16 weights, unlike the autocast runs above.
          # FSDP2, because FSDP1 on one process switches itself to NO_SHARD, a slower path (RESULTS.md)
          run accelerate launch --config_file $cfg/fsdp2_full_shard.yaml --num_processes 1 $t --bf16 --out "$out/sc_fsdp_1gpu.json"
          continue
        fi
        run torchrun --standalone --nproc_per_node "$k" benchmarks/allreduce.py --out "$out/sc_allreduce_${k}gpu.json"
        run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$k" $t --bf16 --measure-comm --out "$out/sc_eager_${k}gpu.json" --baseline "$out/sc_eager_1gpu.json"
        run accelerate launch --config_file $cfg/ddp.yaml --num_processes "$k" $t --bf16 --compile --measure-comm --bucket-mb 200 --bucket-view --out "$out/sc_compiled_${k}gpu.json" --baseline "$out/sc_compiled_1gpu.json"
        run accelerate launch --config_file $cfg/fsdp2_full_shard.yaml --num_processes "$k" $t --bf16 --out "$out/sc_fsdp_${k}gpu.json" --baseline "$out/sc_fsdp_1gpu.json"
      done
      run python benchmarks/scaling_chart.py "$out" --png "$out/scaling.png" ;;
    trl) n=$(python -c "import torch; print(torch.cuda.device_count())")
      run accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes "$n" benchmarks/post_train_trl.py --out "$out/post_train_trl_${n}gpu.json" --bf16 ;;
    fused) run python benchmarks/fused_check.py --out "$out/fused_check.json" ;;
    phase3) run python benchmarks/phase3_inference.py --out "$out/phase3_inference.json"
      run python benchmarks/decode_tuning.py "$out/decode_tuning.json" ;;
    decode) run python benchmarks/decode_tuning.py "$out/decode_tuning.json" ;;
    serving) run python benchmarks/phase4_serving.py --out "$out/phase4_serving.json" --budget-s 400 ;;
    vllmbench) # the course's load generator beside `vllm bench serve` on one vLLM server each: bf16, fp16, then fp8 weights
      a="--preset llama-1.1b --pairs 2 --num-requests 64 --input-len 256 --output-len 64 --concurrency 8"
      run python benchmarks/loadgen_vs_vllm_bench.py $a --dtype bf16 --out "$out/lvb_bf16.json"
      run python benchmarks/loadgen_vs_vllm_bench.py $a --dtype fp16 --out "$out/lvb_fp16.json"
      run python benchmarks/loadgen_vs_vllm_bench.py $a --dtype bf16 --quantization fp8 --out "$out/lvb_fp8.json" ;;
    t4|t4:*) # every lab (t4) or one (t4:ASSIGNMENT) graded live as a T4 learner runs it (utils/device/rehearsal.py:
      # T4 memory cap, fp16, T4 sizes); peak device memory from nvidia-smi every 0.5 s, engines in their own processes
      # included, then by notebook cell (benchmarks/memory_by_cell.py)
      labs="00_foundations 01_single_gpu 02_multi_gpu 03_inference_serving 04_benchmarking_production 05_hardware_and_cost"
      [ "$step" = t4 ] || labs=${step#t4:}
      for a in $labs; do
        t0=$(date -u +%FT%T.%3NZ)
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$out/t4_mem_$a.txt" & smi=$!
        GPULAB_TIER=t4 run python -m grader.gpu_check "$out/t4_$a" --assignment "$a" --live-only
        kill $smi; t1=$(date -u +%FT%T.%3NZ)
        echo "$a peak_mib $(sort -n "$out/t4_mem_$a.txt" | tail -1)" | tee -a "$out/t4_peaks.txt"
        run python benchmarks/memory_by_cell.py "$out/t4_$a/gpu/autograded/self/$a.ipynb" "$out/t4_mem_$a.txt" \
          --start "$t0" --end "$t1" --json "$out/t4_memcells_$a.json"
      done ;;
    lab:*) a=${step#lab:}; run python -m grader.gpu_check "$out/lab_$a" --assignment "$a" --live-only ;;
    *) echo "unknown step $step" | tee -a "$log" ;;
  esac
done
