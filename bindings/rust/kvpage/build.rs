// SPDX-License-Identifier: Apache-2.0
//! An rpath to the libkvpage.so that kvpage-sys found, for this crate's own
//! tests and examples (a library crate's link arguments do not reach the
//! binaries of its users; they set their own rpath or LD_LIBRARY_PATH).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KVPAGE_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_KVPAGE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
