// SPDX-License-Identifier: Apache-2.0
//! An rpath to the libkvpage.so that kvpage-sys found, for this crate's own
//! tests, examples and doc tests (a library crate's link arguments do not
//! reach the binaries of its users: their build scripts add the same line,
//! with kvpage-sys among their dependencies; see the crate's "Linking").
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KVPAGE_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_KVPAGE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
