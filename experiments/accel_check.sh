#!/usr/bin/env bash
# The accelerator figures of docs/results.md ("On an accelerator"), in one call that fits a
# 10-minute device command: the BERT-large stage (seq 128, micro-batch 32; float32, bf16, both
# attention paths) with a trace of the bf16 step, then the pipeline of one and two stages against
# the plain jitted step and a stage's peak memory against the planner's charge. Each part has its
# own time limit, so a slow part still leaves the others' figures.
#
#   bash experiments/accel_check.sh OUT_DIR      # writes stage.log, pipeline_memory.log, trace/
set -u
out=${1:?usage: accel_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
bench="python3 $(dirname "$0")/accel_bench.py"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$out/device.txt"
timeout 270 $bench --parts stage --stage_models large --stage_seqs 128 --trace "$out/trace" \
  2>&1 | grep -v "^[IW][0-9]" | tee "$out/stage.log"
timeout 270 $bench --parts pipeline,memory 2>&1 | grep -v "^[IW][0-9]" | tee "$out/pipeline_memory.log"
