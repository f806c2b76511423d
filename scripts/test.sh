#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run ctest. GPU tests
# skip themselves where no GPU is present.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing python3 cargo golang-go
configure_and_build -DKVPAGE_BUILD_TESTS=ON
cd "$BUILD_DIR"
ctest --output-on-failure -j "$JOBS" --timeout 600
cd - >/dev/null
# Host code under ASan+UBSan and TSan, and a short fuzz run (docs/RELIABILITY.md).
bash scripts/test_sanitizers.sh
