#!/bin/bash
# The kit's stage1 in two calls, for a checkout whose tree no longer fits beside the whole c1 carry
# (tree + 56 MB C.so.xz > 64 MiB once the matrix receipts were committed). From the repository root:
#   here:   bash scripts/h200/stage_split.sh split      # .devstage/c1a, .devstage/c1b (halves of c1)
#   device: run("bash scripts/h200/stage_split.sh recv", carry=[".devstage/c1a", ".devstage/kit"])
#           run("bash scripts/h200/stage_split.sh recv", carry=[".devstage/c1b", ".devstage/kit"])  # at once
#   then the kit's call 2 as before (enter.sh with .devstage/c2).
# vLLM's _moe_C (.devstage/m1, 40 MB, scripts/h200/build_carries.sh moe) is over one carry beside the
# tree too: `split-m1` here writes .devstage/m1a and .devstage/m1b; `recv-m1` there, once with each,
# puts .devstage/m1/moe_C.so.xz back where run_h200.sh's moe_lib finds it in the later calls.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  split)
    rm -rf .devstage/c1a .devstage/c1b && mkdir -p .devstage/c1a .devstage/c1b
    half=$(( ($(stat -c %s .devstage/c1/C.so.xz) + 1) / 2 ))
    head -c "$half" .devstage/c1/C.so.xz > .devstage/c1a/C.so.xz.part1
    tail -c +"$((half + 1))" .devstage/c1/C.so.xz > .devstage/c1b/C.so.xz.part2
    sha256sum .devstage/c1/C.so.xz | cut -d' ' -f1 > .devstage/c1b/C.so.xz.sha256
    ls -la .devstage/c1a .devstage/c1b ;;
  recv)
    mkdir -p /tmp/c1parts
    for d in .devstage/c1a .devstage/c1b; do [ -d $d ] && cp $d/* /tmp/c1parts/; done
    if [ -f /tmp/c1parts/C.so.xz.part1 ] && [ -f /tmp/c1parts/C.so.xz.part2 ]; then
      mkdir -p .devstage/c1
      cat /tmp/c1parts/C.so.xz.part1 /tmp/c1parts/C.so.xz.part2 > .devstage/c1/C.so.xz
      [ "$(sha256sum .devstage/c1/C.so.xz | cut -d' ' -f1)" = "$(cat /tmp/c1parts/C.so.xz.sha256)" ] \
        || { echo "C.so.xz halves do not add up (sha256)"; exit 3; }
      bash .devstage/kit/stage1.sh
    else
      echo "half received; carry the other one in the next call"; ls -la /tmp/c1parts
    fi ;;
  split-m1)
    rm -rf .devstage/m1a .devstage/m1b && mkdir -p .devstage/m1a .devstage/m1b
    half=$(( ($(stat -c %s .devstage/m1/moe_C.so.xz) + 1) / 2 ))
    head -c "$half" .devstage/m1/moe_C.so.xz > .devstage/m1a/moe_C.so.xz.part1
    tail -c +"$((half + 1))" .devstage/m1/moe_C.so.xz > .devstage/m1b/moe_C.so.xz.part2
    sha256sum .devstage/m1/moe_C.so.xz | cut -d' ' -f1 > .devstage/m1b/moe_C.so.xz.sha256
    ls -la .devstage/m1a .devstage/m1b ;;
  recv-m1)
    mkdir -p /tmp/m1parts
    for d in .devstage/m1a .devstage/m1b; do [ -d $d ] && cp $d/* /tmp/m1parts/; done
    if [ -f /tmp/m1parts/moe_C.so.xz.part1 ] && [ -f /tmp/m1parts/moe_C.so.xz.part2 ]; then
      mkdir -p .devstage/m1
      cat /tmp/m1parts/moe_C.so.xz.part1 /tmp/m1parts/moe_C.so.xz.part2 > .devstage/m1/moe_C.so.xz
      [ "$(sha256sum .devstage/m1/moe_C.so.xz | cut -d' ' -f1)" = "$(cat /tmp/m1parts/moe_C.so.xz.sha256)" ] \
        || { echo "moe_C.so.xz halves do not add up (sha256)"; exit 3; }
      ls -la .devstage/m1
    else
      echo "half received; carry the other one in the next call"; ls -la /tmp/m1parts
    fi ;;
  *) echo "usage: $0 split|recv|split-m1|recv-m1"; exit 2 ;;
esac
