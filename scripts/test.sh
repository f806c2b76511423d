#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: install what is missing, build, run ctest. GPU tests
# skip themselves where no GPU is present.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing python3 python3-pip python3-setuptools python3-wheel cargo golang-go clang-format
# Every C, C++ and CUDA source as .clang-format lays it out.
git ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fuzz/corpus/' |
  xargs clang-format --dry-run -Werror
configure_and_build -DKVPAGE_BUILD_TESTS=ON
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS" --timeout 600
cd - >/dev/null
# Host code under ASan+UBSan and TSan, and a short fuzz run (docs/RELIABILITY.md).
bash scripts/test_sanitizers.sh
