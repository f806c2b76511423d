#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the build tree into a fresh prefix, then builds a consumer with
# find_package(kvpage) and another with pkg-config, and runs both.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/kvpage/kvpage.h"
cmake -S "$src_dir" -B "$work/cmake-consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake-consumer" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/cmake-consumer/consumer"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
cc -std=c99 "$src_dir/main.c" $(pkg-config --cflags --libs kvpage) -o "$work/pc-consumer"
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/pc-consumer"
echo "install test: find_package and pkg-config consumers OK"
