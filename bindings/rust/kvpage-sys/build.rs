// SPDX-License-Identifier: Apache-2.0
//! Finds libkvpage.so: `KVPAGE_DIR` (an install prefix or a CMake build
//! tree), then `pkg-config kvpage`, then the checkout's `build/` folder, then
//! the linker's default paths. Standard library only (no `pkg-config` or
//! `cc` crates: the build must work offline).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIB_FILE: &str = "libkvpage.so";
const HEADER: &str = "kvpage/kvpage.h";

fn main() {
    for var in [
        "KVPAGE_DIR",
        "KVPAGE_INCLUDE_DIR",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets this"));
    // bindings/rust/kvpage-sys -> the repository root, when built in a checkout.
    let checkout = manifest_dir.join("../../..");

    let (lib_dir, mut include_dir) = if let Some(dir) = env::var_os("KVPAGE_DIR") {
        let dir = PathBuf::from(dir);
        match lib_dir_under(&dir) {
            Some(lib) => (Some(lib), header_dir(&dir.join("include"))),
            None => panic!(
                "KVPAGE_DIR={} holds no {} (looked in ., lib, lib64 and lib/<multiarch>)",
                dir.display(),
                LIB_FILE
            ),
        }
    } else if let Some(found) = pkg_config() {
        found
    } else if let Some(lib) = lib_dir_under(&checkout.join("build")) {
        (Some(lib), None)
    } else {
        println!(
            "cargo:warning=kvpage-sys: libkvpage.so not found through KVPAGE_DIR, pkg-config \
             or the checkout's build/; linking -lkvpage from the default paths"
        );
        (None, None)
    };

    if let Some(dir) = env::var_os("KVPAGE_INCLUDE_DIR") {
        include_dir = header_dir(Path::new(&dir));
    }
    if include_dir.is_none() {
        include_dir = header_dir(&checkout.join("include"));
    }

    if let Some(lib) = &lib_dir {
        println!("cargo:rustc-link-search=native={}", lib.display());
        // Dependent build scripts read DEP_KVPAGE_LIB_DIR (e.g. for an rpath).
        println!("cargo:lib_dir={}", lib.display());
        // This crate's own tests find the library without LD_LIBRARY_PATH.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
    println!("cargo:rustc-link-lib=dylib=kvpage");
    if let Some(inc) = &include_dir {
        println!("cargo:include={}", inc.display());
        // The layout test compiles a C program against this header.
        println!("cargo:rustc-env=KVPAGE_SYS_INCLUDE_DIR={}", inc.display());
    } else {
        println!("cargo:rustc-env=KVPAGE_SYS_INCLUDE_DIR=");
    }
}

/// The folder holding libkvpage.so: `dir` itself (a build tree) or its
/// `lib`, `lib64` or `lib/<multiarch>` (an install prefix).
fn lib_dir_under(dir: &Path) -> Option<PathBuf> {
    let mut candidates = vec![dir.to_path_buf(), dir.join("lib"), dir.join("lib64")];
    if let Ok(entries) = std::fs::read_dir(dir.join("lib")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with("-linux-gnu") {
                candidates.push(e.path());
            }
        }
    }
    candidates
        .into_iter()
        .find(|c| c.join(LIB_FILE).exists())
        .map(|c| c.canonicalize().unwrap_or(c))
}

fn header_dir(dir: &Path) -> Option<PathBuf> {
    if dir.join(HEADER).exists() {
        Some(dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()))
    } else {
        None
    }
}

/// `pkg-config --libs-only-L --cflags-only-I kvpage`, run by hand.
fn pkg_config() -> Option<(Option<PathBuf>, Option<PathBuf>)> {
    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(pkg_config)
        .args(["--libs-only-L", "--cflags-only-I", "kvpage"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lib = None;
    let mut inc = None;
    for flag in text.split_whitespace() {
        if let Some(d) = flag.strip_prefix("-L") {
            lib = lib.or_else(|| lib_dir_under(Path::new(d)));
        } else if let Some(d) = flag.strip_prefix("-I") {
            inc = inc.or_else(|| header_dir(Path::new(d)));
        }
    }
    // pkg-config omits -L for system directories: the linker's defaults work.
    Some((lib, inc))
}
