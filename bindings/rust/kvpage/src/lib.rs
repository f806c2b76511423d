// SPDX-License-Identifier: Apache-2.0
//! Safe Rust bindings of kvpage: a paged KV cache (BF16/FP16, or FP8/INT8/INT4
//! with per-token-per-head scales), its sequences and block tables, the
//! quantizing write, decode attention and attention over query chunks of
//! varying lengths ([`Decoder::attend`]), and packed buffers that move a
//! sequence's blocks to a cache in another process ([`Cache::pack`]), over
//! the stable C ABI of `libkvpage.so` (raw declarations in [`kvpage_sys`]).
//!
//! - Handles are owned values that release their C objects on [`Drop`].
//!   A [`Cache`] is a shared handle ([`Clone`] gives another one to the
//!   same cache) and each [`Decoder`] holds one, so decoders borrow
//!   nothing: an engine keeps a cache and its decoders in one struct. The C
//!   cache is destroyed with its last handle, after its decoders.
//! - Every fallible call returns [`Result<T>`](Result) with an [`Error`]
//!   carrying the library's stable [`ErrorCode`] and its message, which names
//!   the bad argument and its value. Nothing panics across the boundary.
//! - Host memory is passed as slices (lengths checked before the call);
//!   device memory (CUDA caches) goes through the `unsafe` `*_raw` calls
//!   with raw pointers and a [`Stream`].
//! - [`Cache`] is `Send + Sync` (the header lets sequence operations, writes
//!   and decodes run from several threads); [`Decoder`] is `Send` only, and
//!   [`Decoder::decode`] takes `&mut self`.
//!
//! # Example
//!
//! A CPU cache with INT8 keys and values, one sequence of three tokens, and
//! a decode of one query token per head:
//!
//! ```
//! use kvpage::{Cache, CacheConfig, DType, DecodeArgs, DecodeConfig, WriteArgs};
//!
//! # fn main() -> Result<(), kvpage::Error> {
//! let cache = Cache::new(&CacheConfig {
//!     head_size: 64,
//!     k_dtype: DType::Int8,
//!     v_dtype: DType::Int8,
//!     ..CacheConfig::new(/* num_blocks */ 32, /* num_kv_heads */ 2)
//! })?;
//!
//! let seq = cache.create_seq()?;
//! let slots = cache.append(seq, 3)?; // where the 3 new tokens go
//! let k: Vec<f32> = (0..3 * 2 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
//! let v: Vec<f32> = (0..3 * 2 * 64).map(|i| (i as f32 * 0.11).cos()).collect();
//! cache.write(&WriteArgs::new(/* layer */ 0, &k, &v, &slots))?;
//!
//! let mut decoder = cache.decoder(&DecodeConfig {
//!     q_dtype: DType::Fp32,
//!     out_dtype: DType::Fp32,
//!     ..DecodeConfig::new(/* query heads */ 4, /* max seqs */ 8, /* max context */ 512)
//! })?;
//! let table = cache.block_table(&[seq], /* width */ 32)?;
//! let q = vec![0.25f32; 4 * 64];
//! let mut out = vec![f32::NAN; 4 * 64];
//! decoder.decode(&DecodeArgs::new(0, &q, &table), &mut out, None)?;
//! assert!(out.iter().all(|x| x.is_finite() && x.abs() <= 1.01));
//!
//! // Errors carry the library's code and a message naming the argument.
//! let err = cache.truncate(seq, 10).unwrap_err();
//! assert_eq!(err.code(), kvpage::ErrorCode::InvalidArgument);
//! assert!(err.message().contains("length"), "{}", err);
//! cache.free_seq(seq)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Linking
//!
//! `kvpage-sys` finds `libkvpage.so` through `KVPAGE_DIR` (an install
//! prefix or a CMake build tree), `pkg-config kvpage`, or the checkout's
//! `build/`, and publishes the folder it found to the build scripts of the
//! crates that depend on it as `DEP_KVPAGE_LIB_DIR`. This crate's own
//! tests, examples and doc tests run without `LD_LIBRARY_PATH`: the build
//! scripts give them an rpath to that folder. Cargo passes link arguments
//! to no other package's binaries, so a program of another package gets
//! its rpath from a build script of its own, with `kvpage-sys` among its
//! dependencies:
//!
//! ```toml
//! [dependencies]
//! kvpage = { path = "/path/to/kvpage/bindings/rust/kvpage" }
//! kvpage-sys = { path = "/path/to/kvpage/bindings/rust/kvpage-sys" }
//! ```
//!
//! ```no_run
//! // build.rs
//! fn main() {
//!     if let Ok(dir) = std::env::var("DEP_KVPAGE_LIB_DIR") {
//!         println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
//!     }
//! }
//! ```
#![warn(missing_debug_implementations)]

mod cache;
mod decode;
mod dtype;
mod error;
mod pack;

pub use cache::{
    BlockTable, Cache, CacheConfig, CacheInfo, Device, LayerLayout, RawWriteArgs, SeqId, Stream,
    WriteArgs, WriteStats,
};
pub use decode::{AttendArgs, DecodeArgs, DecodeConfig, Decoder, RawAttendArgs, RawDecodeArgs};
pub use dtype::{Bf16, DType, Element, F16};
pub use error::{Error, ErrorCode, Result};
pub use kvpage_sys;
pub use pack::{FormatSignature, PackArgs, PackBuffer, RawPackArgs};

use kvpage_sys as sys;

/// The package version of the loaded library, e.g. `"0.1.0"`.
pub fn version() -> &'static str {
    // SAFETY: a static string.
    unsafe { error::static_str(sys::kvp_version_string()) }
}

/// The ABI version `(major, minor)` of the loaded library.
pub fn abi_version() -> (u32, u32) {
    let (mut major, mut minor) = (0u32, 0u32);
    // SAFETY: two out-pointers.
    unsafe { sys::kvp_abi_version(&mut major, &mut minor) };
    (major, minor)
}

/// What the loaded library holds (backends, CUDA architectures, dtypes, head
/// and block sizes): one line of `key=value` pairs separated by `"; "`.
pub fn build_info() -> &'static str {
    // SAFETY: a static string.
    unsafe { error::static_str(sys::kvp_build_info()) }
}

/// The number of CUDA devices this build can use (0 without a CUDA backend
/// or without a GPU; that is not an error).
pub fn cuda_device_count() -> Result<i32> {
    let mut n = 0;
    // SAFETY: out-pointer.
    error::check(unsafe { sys::kvp_device_count(sys::KVP_DEVICE_CUDA, &mut n) })?;
    Ok(n)
}
