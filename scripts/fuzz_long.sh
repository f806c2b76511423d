#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A long fuzz run of the C API (docs/RELIABILITY.md, "Fuzzing the C API"):
# the ASan+UBSan libFuzzer build of scripts/test_sanitizers.sh
# (build-asan/tests/fuzz/kvpage_fuzz), WORKERS processes for SECONDS,
# starting from the committed seed corpus and a work corpus that keeps
# growing across runs (FUZZ_DIR/corpus). Prints the run's executions (the
# workers' "Done N runs" summed) and exits 1 on any finding.
#   bash scripts/fuzz_long.sh [SECONDS [WORKERS]]      # default 3600, nproc
#   bash scripts/fuzz_long.sh --bundle FILE            # the same, packed to run
#       on a machine without clang or Abseil (tar xJf FILE && bash b/fuzz_long.sh ...)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -x "$here/kvpage_fuzz" ]; then  # inside a bundle
  FUZZER=$here/kvpage_fuzz
  SEEDS=$here/corpus
  export LD_LIBRARY_PATH=$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  cd "$here/.."
  if [ ! -x build-asan/tests/fuzz/kvpage_fuzz ]; then
    KVPAGE_FUZZ_SECONDS=1 bash scripts/test_sanitizers.sh >/dev/null
  fi
  cmake --build build-asan --target kvpage_fuzz -j "$(nproc)" >/dev/null
  FUZZER=$PWD/build-asan/tests/fuzz/kvpage_fuzz
  SEEDS=$PWD/tests/fuzz/corpus
fi

if [ "${1:-}" = "--bundle" ]; then
  out=$(realpath -m "$2")
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/b/corpus"
  cp "$FUZZER" scripts/fuzz_long.sh "$stage/b/"
  cp -P build-asan/libkvpage.so* "$stage/b/"
  ldd "$FUZZER" | awk '/libabsl_/ {print $3}' | xargs -r cp -L -t "$stage/b/"
  cp "$SEEDS"/* "$stage/b/corpus/"
  [ -d "${FUZZ_DIR:-fuzz-work}/corpus" ] && cp -r "${FUZZ_DIR:-fuzz-work}/corpus/." "$stage/b/corpus/"
  tar cJf "$out" -C "$stage" b
  echo "bundle: $out ($(du -h "$out" | cut -f1), $(ls "$stage/b/corpus" | wc -l) corpus inputs)"
  exit 0
fi

SECONDS_TO_RUN=${1:-3600}
WORKERS=${2:-$(nproc)}
FUZZ_DIR=$(realpath -m "${FUZZ_DIR:-fuzz-work}")
run=$FUZZ_DIR/run-$(date +%Y%m%d-%H%M%S)
mkdir -p "$FUZZ_DIR/corpus" "$run"
cd "$run"
echo "== $WORKERS workers for $SECONDS_TO_RUN s, logs in $run"
start=$(date +%s)
rc=0
"$FUZZER" -max_len=1024 -timeout=30 -rss_limit_mb=8192 -max_total_time="$SECONDS_TO_RUN" \
  -jobs="$WORKERS" -workers="$WORKERS" "$FUZZ_DIR/corpus" "$SEEDS" > launcher.log 2>&1 || rc=$?
echo "== exit $rc after $(( $(date +%s) - start )) s"
# A worker's executions: its "Done N runs" line, or where it was stopped
# before writing one, the last "#N" status line.
total=0
for f in fuzz-*.log; do
  n=$(awk '/^Done [0-9]+ runs/ {d = $2} /^#[0-9]+/ {sub("#", "", $1); l = $1} END {print d ? d : l + 0}' "$f")
  total=$((total + n))
done
echo "== executions: $total ($(ls fuzz-*.log | wc -l) workers)"
if grep -lE "ERROR: |runtime error|deadly signal|invariant violated|Test unit written" fuzz-*.log ||
   ls crash-* leak-* timeout-* oom-* 2>/dev/null; then
  echo "== FINDINGS above (inputs saved in $run)"
  exit 1
fi
echo "== no finding"
