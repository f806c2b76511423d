#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Usage: subproject_test.sh MODE KVPAGE_SOURCE_DIR WORK_DIR CC CXX
# Builds tests/consumer/subproject with kvpage as a subproject (MODE:
# add_subdirectory or fetchcontent) into WORK_DIR (kept, so that a rerun is
# incremental), runs the program, installs it with kvpage into a fresh
# prefix and runs the installed program with LD_LIBRARY_PATH unset.
set -euo pipefail
mode=$1 kvpage_src=$2 work=$3 cc=$4 cxx=$5
here=$(cd "$(dirname "$0")" && pwd)
unset CMAKE_BUILD_TYPE  # CMake reads it from the environment too
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
mkdir -p "$work"
log="$work/last.log"
step() {  # runs a command with its output in $log, shown if it fails
  if ! "$@" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "FAILED: $*"
    exit 1
  fi
}
configure() {  # build dir, extra arguments
  local dir=$1
  shift
  step cmake -S "$here/subproject" -B "$dir" -DKVPAGE_CONSUMER_MODE="$mode" \
    -DKVPAGE_SOURCE_DIR="$kvpage_src" -DKVPAGE_CUDA=OFF \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "$@"
}

configure "$work/build"
step cmake --build "$work/build"
env -u LD_LIBRARY_PATH "$work/build/consumer"
rm -rf "$work/prefix"
step cmake --install "$work/build" --prefix "$work/prefix"
test -f "$work/prefix/share/doc/kvpage/LICENSE"
test ! -e "$work/prefix/share/doc/kvpage_subproject_consumer/LICENSE"
readelf -d "$work/prefix/bin/consumer" | grep -q 'RUNPATH.*\$ORIGIN/\.\./lib'
env -u LD_LIBRARY_PATH "$work/prefix/bin/consumer"
if [ "$mode" = add_subdirectory ]; then
  # KVPAGE_BUILD_TESTS set by the parent adds the tests (configure only).
  configure "$work/with-tests" -DKVPAGE_CONSUMER_WITH_TESTS=ON
fi
echo "subproject test ($mode): build type, tests and install folders left to the parent; consumer OK"
