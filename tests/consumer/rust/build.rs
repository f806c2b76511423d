// SPDX-License-Identifier: Apache-2.0
//! An rpath to the folder where kvpage-sys found libkvpage.so: cargo passes
//! a dependency's link arguments to no binary of this package.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KVPAGE_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_KVPAGE_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
