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
split_halves() {  # carry (c1, m1) file: .devstage/<carry>a/<file>.part1, .devstage/<carry>b/<file>.part2 + sha256
  local c=$1 f=$2 half
  rm -rf .devstage/${c}a .devstage/${c}b && mkdir -p .devstage/${c}a .devstage/${c}b
  half=$(( ($(stat -c %s .devstage/$c/$f) + 1) / 2 ))
  head -c "$half" .devstage/$c/$f > .devstage/${c}a/$f.part1
  tail -c +"$((half + 1))" .devstage/$c/$f > .devstage/${c}b/$f.part2
  sha256sum .devstage/$c/$f | cut -d' ' -f1 > .devstage/${c}b/$f.sha256
  ls -la .devstage/${c}a .devstage/${c}b
}
recv_halves() {  # carry file: 0 once both halves came and .devstage/<carry>/<file> is whole again, 1 before
  local c=$1 f=$2
  mkdir -p /tmp/${c}parts
  for d in .devstage/${c}a .devstage/${c}b; do [ -d $d ] && cp $d/* /tmp/${c}parts/; done
  if [ -f /tmp/${c}parts/$f.part1 ] && [ -f /tmp/${c}parts/$f.part2 ]; then
    mkdir -p .devstage/$c
    cat /tmp/${c}parts/$f.part1 /tmp/${c}parts/$f.part2 > .devstage/$c/$f
    [ "$(sha256sum .devstage/$c/$f | cut -d' ' -f1)" = "$(cat /tmp/${c}parts/$f.sha256)" ] \
      || { echo "$f halves do not add up (sha256)"; exit 3; }
    return 0
  fi
  echo "half received; carry the other one in the next call"; ls -la /tmp/${c}parts
  return 1
}
case "${1:-}" in
  split) split_halves c1 C.so.xz ;;
  recv) if recv_halves c1 C.so.xz; then bash .devstage/kit/stage1.sh; fi ;;
  split-m1) split_halves m1 moe_C.so.xz ;;
  recv-m1) if recv_halves m1 moe_C.so.xz; then ls -la .devstage/m1; fi ;;
  *) echo "usage: $0 split|recv|split-m1|recv-m1"; exit 2 ;;
esac
