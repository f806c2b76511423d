#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-call A/B of two staged builds on a GPU machine (docs/DESIGN.md,
# "Changing a kernel"): register and spill counts of every kernel, and
# kvpage-bench of both libraries in alternating rounds, each round with the
# decode outputs' fingerprints; then one table of both (scripts/ab_compare.py).
#   scripts/gpu_ab.sh BASE_LIB_DIR NEW_DIR OUT_DIR [ROUNDS] [kvpage-bench args...]
# NEW_DIR holds kvpage-bench and libkvpage.so (scripts/stage_gpu.sh's .gpu);
# BASE_LIB_DIR a libkvpage.so of the build to compare with. The new build's
# kvpage-bench runs against both (it uses the public C API only).
set -euo pipefail
base=$1 new=$2 out=$3 rounds=${4:-2}
shift $(( $# >= 4 ? 4 : 3 ))
mkdir -p "$out"
if command -v cuobjdump >/dev/null; then
  for side in base new; do
    dir=$base; [ $side = new ] && dir=$new
    # Kernel names with the plan struct's name folded, so renames compare.
    cuobjdump --dump-resource-usage "$dir/libkvpage.so" 2>/dev/null |
      sed -e 's/11DecodeShape/10DecodePlan/g' > "$out/resources_$side.txt" || true
  done
fi
for r in $(seq 1 "$rounds"); do
  order="base new"; [ $((r % 2)) -eq 0 ] && order="new base"
  for side in $order; do
    dir=$base; [ $side = new ] && dir=$new
    LD_LIBRARY_PATH="$dir:$new" "$new/kvpage-bench" --csv "$out/bench_${side}_$r.csv" \
      --hashes "$out/hashes_${side}_$r.txt" "$@" > "$out/bench_${side}_$r.txt"
  done
done
python3 "$(dirname "$0")/ab_compare.py" "$out"
