#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the build tree into a fresh prefix, then builds consumers of it
# and runs each with LD_LIBRARY_PATH unset: through find_package (from its
# build folder and installed), pkg-config, and, where the build found cargo
# and go, a Rust crate (tests/consumer/rust) and a Go program
# (tests/consumer/go).
set -euo pipefail
build_dir=$(cd "$1" && pwd)
src_dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src_dir/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset CMAKE_BUILD_TYPE
run() { env -u LD_LIBRARY_PATH "$@"; }
runpath() { readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p'; }
has_runpath() {  # program, folder its RUNPATH must name
  case ":$(runpath "$1"):" in
    *":$2:"*) ;;
    *) echo "$1: RUNPATH '$(runpath "$1")' lacks $2"; return 1 ;;
  esac
}
cached() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt"; }

prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
test -f "$prefix/include/kvpage/kvpage.h"
pc=$(find "$prefix" -name kvpage.pc)
libdir=$(dirname "$(dirname "$pc")")
has_runpath "$libdir/libkvpage.so" '$ORIGIN'

# find_package: the build folder's program, then the installed one.
cmake -S "$src_dir" -B "$work/cmake-consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-consumer" >/dev/null
run "$work/cmake-consumer/consumer"
cmake --install "$work/cmake-consumer" --prefix "$work/app" >/dev/null
has_runpath "$work/app/bin/consumer" "$libdir"
run "$work/app/bin/consumer"

# pkg-config: Libs carry -Wl,-rpath,${libdir}.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[[ "$(pkg-config --libs kvpage)" == *-Wl,-rpath,* ]]
cc -std=c99 "$src_dir/main.c" $(pkg-config --cflags --libs kvpage) -o "$work/pc-consumer"
has_runpath "$work/pc-consumer" "$(pkg-config --variable=libdir kvpage)"
run "$work/pc-consumer"

# Rust: kvpage-sys finds the library through KVPAGE_DIR; the crate's build
# script adds the rpath. A copy of the crate, so that the checkout gets no
# Cargo.lock; the target folder stays in the build folder for reruns.
cargo=$(cached KVPAGE_CARGO)
[ -x "${cargo:-}" ] || cargo=$(command -v cargo || true)
if [ -n "$cargo" ]; then
  mkdir -p "$work/rust"
  cp -r "$src_dir/rust/src" "$src_dir/rust/build.rs" "$work/rust/"
  sed "s|\.\./\.\./\.\./bindings|$root/bindings|" "$src_dir/rust/Cargo.toml" >"$work/rust/Cargo.toml"
  env KVPAGE_DIR="$prefix" CARGO_HOME="$build_dir/consumer-rust/cargo-home" \
    CARGO_TARGET_DIR="$build_dir/consumer-rust/target" CARGO_NET_OFFLINE=true \
    "$cargo" build --offline --quiet --manifest-path "$work/rust/Cargo.toml"
  exe=$build_dir/consumer-rust/target/debug/kvpage-consumer
  has_runpath "$exe" "$libdir"
  run "$exe"
else
  echo "install test: no cargo, Rust consumer skipped"
fi

# Go: cgo takes the flags of `#cgo pkg-config: kvpage`, the rpath included.
# A fresh build cache: Go's does not key cgo packages on pkg-config's output.
go=$(cached KVPAGE_GO)
[ -x "${go:-}" ] || go=$(command -v go || true)
if [ -n "$go" ]; then
  (cd "$src_dir/go" && env GOCACHE="$work/gocache" GOPATH="$work/gopath" \
    GOENV=off GOPROXY=off GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=1 CC="$(cached CMAKE_C_COMPILER)" \
    "$go" build -o "$work/go-consumer" .)
  has_runpath "$work/go-consumer" "$(pkg-config --variable=libdir kvpage)"
  run "$work/go-consumer"
else
  echo "install test: no go, Go consumer skipped"
fi
echo "install test: find_package, pkg-config, Rust and Go consumers run without LD_LIBRARY_PATH"
