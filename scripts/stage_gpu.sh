#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds Release binaries for one CUDA architecture and stages them, with
# the Abseil shared libraries they need, in .gpu/ (git-ignored) so that a
# GPU machine without Abseil can run them: LD_LIBRARY_PATH=.gpu.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ARCH=${KVPAGE_CUDA_ARCHS:-90a}
BUILD_DIR=${BUILD_DIR:-build-gpu}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKVPAGE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
rm -rf .gpu && mkdir -p .gpu
bins=(tests/kvpage_unit_tests tests/kvpage_capi_tests tests/kvpage_c99_test
      tests/kvpage_dlopen_test examples/kvpage_decode_loop)
for b in "${bins[@]}"; do [ -f "$BUILD_DIR/$b" ] && cp "$BUILD_DIR/$b" .gpu/; done
for b in "$BUILD_DIR"/bench/kvpage-bench; do [ -f "$b" ] && cp "$b" .gpu/; done
cp -P "$BUILD_DIR"/libkvpage.so* .gpu/
# Every Abseil library any staged binary loads.
for f in .gpu/*; do ldd "$f" 2>/dev/null; done | awk '/libabsl_/ {print $3}' | sort -u |
  while read -r lib; do cp -L "$lib" .gpu/; done
du -sh .gpu
# The same, compressed for the trip to a GPU machine (cubins compress ~3x):
# there, `mkdir -p .gpu && tar xzf .gpuz/gpu.tgz -C .gpu`.
rm -rf .gpuz && mkdir -p .gpuz
tar czf .gpuz/gpu.tgz -C .gpu .
du -sh .gpuz
