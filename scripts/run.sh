#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: install what is missing, build, run the example decode loop
# (CUDA backend where a GPU and the CUDA backend are present, CPU otherwise).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing
configure_and_build -DKVPAGE_BUILD_TESTS=OFF -DKVPAGE_BUILD_EXAMPLES=ON
for dtype in ${KVPAGE_DTYPES:-bf16 int8 int4}; do
  "$BUILD_DIR/examples/kvpage_decode_loop" "$dtype" "${KVPAGE_STEPS:-16}"
done
