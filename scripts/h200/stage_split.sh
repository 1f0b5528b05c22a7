#!/bin/bash
# The kit's stage1 in two calls, for a checkout whose tree no longer fits beside the whole c1 carry
# (tree + 56 MB C.so.xz > 64 MiB once the matrix receipts were committed). From the repository root:
#   here:   bash scripts/h200/stage_split.sh split      # .devstage/c1a, .devstage/c1b (halves of c1)
#   device: run("bash scripts/h200/stage_split.sh recv", carry=[".devstage/c1a", ".devstage/kit"])
#           run("bash scripts/h200/stage_split.sh recv", carry=[".devstage/c1b", ".devstage/kit"])  # at once
#   then the kit's call 2 as before (enter.sh with .devstage/c2).
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
  *) echo "usage: $0 split|recv"; exit 2 ;;
esac
