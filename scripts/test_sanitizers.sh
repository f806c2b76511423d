#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The reliability checks of docs/RELIABILITY.md, on the host code (no CUDA):
#  1. build-asan: clang, AddressSanitizer + UndefinedBehaviorSanitizer (and
#     LeakSanitizer), with libFuzzer coverage. Runs the unit and C API
#     suites, the host allocation-failure test, the C99 and dlopen
#     programs, the fuzzer over its seed corpus, then the fuzzer itself for
#     KVPAGE_FUZZ_SECONDS (default 60).
#  2. build-tsan: clang, ThreadSanitizer. Runs the unit and C API suites
#     (their thread tests: several threads working one cache).
# scripts/test.sh runs this after the main suite; KVPAGE_SANITIZERS=0 skips it.
# Any sanitizer report fails the run.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ "${KVPAGE_SANITIZERS:-1}" = "0" ]; then
  echo "== sanitizers skipped (KVPAGE_SANITIZERS=0)"
  exit 0
fi
install_missing clang libclang-rt-14-dev
FUZZ_SECONDS=${KVPAGE_FUZZ_SECONDS:-60}
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# history_size=7: the longest access history, so that races between
# accesses far apart in time are still seen (docs/RELIABILITY.md).
export TSAN_OPTIONS="halt_on_error=1:history_size=7:second_deadlock_stack=1"

configure() {  # build dir, sanitizers, extra args
  local dir=$1 san=$2
  shift 2
  CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVPAGE_CUDA=OFF \
    -DKVPAGE_BUILD_EXAMPLES=OFF -DKVPAGE_SANITIZE="$san" "$@" >/dev/null
}

# Runs the given commands two at a time; fails if any fails.
run_parallel() {
  local pids=() names=() failed=0 i
  for cmd in "$@"; do
    bash -c "$cmd" > "$LOGS/$(echo "$cmd" | tr -c 'A-Za-z0-9' '_' | cut -c1-60).log" 2>&1 &
    pids+=($!)
    names+=("$cmd")
    if [ ${#pids[@]} -ge "$JOBS" ]; then
      wait "${pids[0]}" || { echo "FAILED: ${names[0]}"; failed=1; }
      pids=("${pids[@]:1}")
      names=("${names[@]:1}")
    fi
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "FAILED: ${names[$i]}"; failed=1; }
  done
  return $failed
}

LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
show_failures() {
  for f in "$LOGS"/*.log; do
    if grep -qE "ERROR: (Address|Leak|Thread)Sanitizer|runtime error|WARNING: ThreadSanitizer|\[  FAILED  \]|invariant violated|deadly signal" "$f"; then
      echo "---- $f"; tail -n 80 "$f"
    fi
  done
}

# ---- AddressSanitizer + UndefinedBehaviorSanitizer, and the fuzzer -----------------
stamp "build-asan: configure and build (ASan + UBSan + libFuzzer coverage)"
configure build-asan "address;undefined" -DKVPAGE_FUZZ=ON
cmake --build build-asan -j "$JOBS" --target kvpage_unit_tests kvpage_capi_tests \
  kvpage_host_oom_test kvpage_c99_test kvpage_dlopen_test kvpage_fuzz
T=build-asan/tests
stamp "build-asan: tests"
run_parallel \
  "$T/kvpage_capi_tests --gtest_brief=1" \
  "$T/kvpage_unit_tests --gtest_brief=1" \
  "$T/kvpage_host_oom_test --gtest_brief=1" \
  "$T/kvpage_c99_test && $T/kvpage_dlopen_test build-asan/libkvpage.so" \
  "$T/fuzz/kvpage_fuzz -runs=0 tests/fuzz/corpus" \
  || { show_failures; exit 1; }
grep -h "bad-input cases checked\|allocation points" "$LOGS"/*.log || true

stamp "build-asan: fuzzing for $FUZZ_SECONDS s (seed corpus tests/fuzz/corpus)"
FUZZ_WORK=$(mktemp -d)
if ! "$T/fuzz/kvpage_fuzz" -max_total_time="$FUZZ_SECONDS" -max_len=1024 -timeout=30 \
     -print_final_stats=1 -artifact_prefix="$FUZZ_WORK/" \
     "$FUZZ_WORK" tests/fuzz/corpus > "$LOGS/fuzz.log" 2>&1; then
  tail -n 80 "$LOGS/fuzz.log"
  echo "FAILED: the fuzzer found an input that breaks an invariant; it is saved as:"
  ls "$FUZZ_WORK"/crash-* "$FUZZ_WORK"/leak-* "$FUZZ_WORK"/timeout-* "$FUZZ_WORK"/oom-* 2>/dev/null
  mkdir -p build-asan/fuzz-findings && cp "$FUZZ_WORK"/*-* build-asan/fuzz-findings/ 2>/dev/null || true
  exit 1
fi
grep -E "^Done|stat::number_of_executed_units|cov:.*DONE" "$LOGS/fuzz.log" | tail -n 2
rm -rf "$FUZZ_WORK"

# ---- ThreadSanitizer ----------------------------------------------------------------
stamp "build-tsan: configure and build (TSan)"
configure build-tsan thread
cmake --build build-tsan -j "$JOBS" --target kvpage_unit_tests kvpage_capi_tests
stamp "build-tsan: tests (thread tests included)"
run_parallel \
  "build-tsan/tests/kvpage_capi_tests --gtest_brief=1" \
  "build-tsan/tests/kvpage_unit_tests --gtest_brief=1" \
  || { show_failures; exit 1; }

stamp "sanitizers and fuzzing: all clean"
