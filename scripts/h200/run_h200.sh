#!/bin/bash
# Reproduce TICA's H200 run (issue 6) from a fresh machine with the staging kit
# (shared/device: vLLM 0.26.0 slimmed into two carries). From the repository root:
#
#   here (no device time, ~2.5 min, needs PyPI):
#     mkdir -p .devstage/kit && cp ../shared/device/*.sh .devstage/kit/ && bash .devstage/kit/build_stage.sh
#   device call 1 (~30 s + the machine's start):
#     run(command="bash .devstage/kit/stage1.sh", carry=[".devstage/c1", ".devstage/kit"], timeout_s=180)
#   device call 2, IMMEDIATELY after (the machine keeps /tmp only ~30 s between calls):
#     run(command="bash scripts/h200/run_h200.sh forward", carry=[".devstage/c2", ".devstage/kit"], timeout_s=600)
#   device call 3, immediately after call 2 on the same warm machine (else repeat calls 1-2 first):
#     run(command="bash scripts/h200/run_h200.sh throughput", timeout_s=600)
#   give_back()
#   here: bash scripts/h200/unpack_fixtures.sh <files_at of call 2> <files_at of call 3>
#
# What comes back under $OUT: receipts.tgz (sealed leg dirs under h200/), logs.tgz, status.json, run.log.
# Device minutes this cost: see scripts/h200/NOTES.md.
set -o pipefail
source .devstage/kit/enter.sh || exit 3
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader | tee "$OUT/run.log"
case "$1" in
  forward)
    # make-model (mid4) -> bi1 (gradcheck, forward 1-5, planted fault, backward, AdamW, reload, forward 6-10)
    # -> bi0 (vLLM BI=0 + HF transformers)
    python3 -m tica.legs.vllm_kernels.producers all --out "$OUT" --work /tmp/tica_h200_fwd \
      --budget 570 --bi1-timeout 330 --bi0-timeout 200 2>&1 | tee -a "$OUT/run.log"
    ;;
  throughput)
    # vllm serve BI=0 and BI=1 (both up, started one after the other) + vllm bench serve,
    # random 8192 in / 1024 out, ignore EOS, c=1/8/32/64, rounds AB/BA/AB, until the deadline
    python3 -m tica.legs.vllm_kernels.producers all --no-forward --throughput --out "$OUT" \
      --work /tmp/tica_h200_tp --budget 575 --rounds 3 --input-len 8192 --output-len 1024 2>&1 | tee -a "$OUT/run.log"
    ;;
  *) echo "usage: $0 forward|throughput"; exit 2 ;;
esac
