// SPDX-License-Identifier: Apache-2.0
//! Raw declarations of the kvpage C ABI (`include/kvpage/kvpage.h`).
//!
//! Hand-written to match the header one for one: every struct is
//! `#[repr(C)]` with the header's fields in the header's order, every
//! function has the header's signature, every constant the header's value.
//! `tests/layout.rs` checks that against the header itself: it compiles a C
//! program that includes `kvpage.h` and compares every struct's size,
//! alignment and field offsets, redeclares every function with the types
//! written here (a mismatch is a C compile error), checks every constant,
//! and fails when the header declares something this crate does not.
//!
//! The conventions are the header's: a call that can fail returns a
//! `*mut kvp_error` (null = success) that the caller frees with
//! [`kvp_error_free`]; structs passed in begin with `struct_size` and are
//! filled by their `kvp_*_init` function first. The safe wrapper is the
//! `kvpage` crate.
//!
//! # Linking
//!
//! The build script looks for `libkvpage.so` in this order:
//!
//! 1. `KVPAGE_DIR`: an install prefix (`lib/`, `lib64/` or
//!    `lib/<multiarch>/` below it) or a CMake build tree (the library
//!    directly inside);
//! 2. `pkg-config kvpage` (`PKG_CONFIG_PATH=<prefix>/lib/pkgconfig`);
//! 3. the build tree `build/` of the kvpage checkout this crate lives in.
//!
//! Otherwise it links `-lkvpage` from the linker's default paths. The
//! library is a shared object: at run time it must be on the loader's path
//! (an rpath, `LD_LIBRARY_PATH`, or a system directory). This crate's own
//! tests get an rpath to the directory found (`-Wl,-rpath`); cargo passes
//! that to no other package, so the directory is exported to dependent
//! build scripts as `DEP_KVPAGE_LIB_DIR`, for an rpath of their own
//! (`cargo:rustc-link-arg=-Wl,-rpath,<dir>`), and the header directory as
//! `DEP_KVPAGE_INCLUDE`.
#![allow(non_camel_case_types)]

use std::marker::{PhantomData, PhantomPinned};

pub use std::ffi::c_void;
pub use std::os::raw::c_char;

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

/// Package version of the header these declarations match.
pub const KVP_VERSION_MAJOR: u32 = 0;
pub const KVP_VERSION_MINOR: u32 = 1;
pub const KVP_VERSION_PATCH: u32 = 0;
pub const KVP_VERSION_STRING: &str = "0.1.0";

/// ABI version of the header these declarations match. Major: something
/// removed or reordered; minor: entries or fields appended.
pub const KVP_ABI_MAJOR: u32 = 1;
pub const KVP_ABI_MINOR: u32 = 4;

// ---------------------------------------------------------------------------
// Struct sizes by ABI version (the header's KVP_<NAME>_STRUCT_SIZE_<major>_<minor>,
// `KVP_STRUCT_SIZE(type, last_field)`: the bytes through that version's last
// field). A `struct_size` of at least the first released size is accepted. The
// values are LP64's; `tests/layout.rs` checks each against the header.
// ---------------------------------------------------------------------------

/// [`kvp_allocator`] through `free` (ABI 1.0).
pub const KVP_ALLOCATOR_STRUCT_SIZE_1_0: usize = 32;
/// [`kvp_cache_config`] through `allocator` (ABI 1.0).
pub const KVP_CACHE_CONFIG_STRUCT_SIZE_1_0: usize = 64;
/// [`kvp_cache_config`] through `checked` (ABI 1.1).
pub const KVP_CACHE_CONFIG_STRUCT_SIZE_1_1: usize = 68;
/// [`kvp_layer_layout`] through `v_scale_bytes` (ABI 1.0).
pub const KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0: usize = 176;
/// [`kvp_cache_info`] through `total_bytes` (ABI 1.0).
pub const KVP_CACHE_INFO_STRUCT_SIZE_1_0: usize = 64;
/// [`kvp_write_args`] through `slot_mapping` (ABI 1.0).
pub const KVP_WRITE_ARGS_STRUCT_SIZE_1_0: usize = 64;
/// [`kvp_write_stats`] through `saturated` (ABI 1.0).
pub const KVP_WRITE_STATS_STRUCT_SIZE_1_0: usize = 24;
/// [`kvp_decode_config`] through `workspace_bytes` (ABI 1.0).
pub const KVP_DECODE_CONFIG_STRUCT_SIZE_1_0: usize = 48;
/// [`kvp_decode_config`] through `precise` (ABI 1.2).
pub const KVP_DECODE_CONFIG_STRUCT_SIZE_1_2: usize = 52;
/// [`kvp_decode_config`] through `max_query_tokens` (ABI 1.3).
pub const KVP_DECODE_CONFIG_STRUCT_SIZE_1_3: usize = 56;
/// [`kvp_decode_args`] through `lse` (ABI 1.0).
pub const KVP_DECODE_ARGS_STRUCT_SIZE_1_0: usize = 112;
/// [`kvp_attend_args`] through `lse` (ABI 1.3, its first release).
pub const KVP_ATTEND_ARGS_STRUCT_SIZE_1_3: usize = 120;
/// [`kvp_api`] through `decode` (ABI 1.0).
pub const KVP_API_STRUCT_SIZE_1_0: usize = 312;
/// [`kvp_api`] through `attend` (ABI 1.3).
pub const KVP_API_STRUCT_SIZE_1_3: usize = 328;
/// [`kvp_pack_args`] through `signature` (ABI 1.4, its first release).
pub const KVP_PACK_ARGS_STRUCT_SIZE_1_4: usize = 56;
/// [`kvp_api`] through `cache_check_signature` (ABI 1.4).
pub const KVP_API_STRUCT_SIZE_1_4: usize = 376;

/// Bytes of a format signature ([`kvp_cache_format_signature`]).
pub const KVP_FORMAT_SIGNATURE_BYTES: usize = 64;

// ---------------------------------------------------------------------------
// Opaque handles (the nomicon's pattern: not constructible, not Send, not
// Sync, not Unpin; only ever behind pointers)
// ---------------------------------------------------------------------------

/// An error object returned by a failing call; free with [`kvp_error_free`].
#[repr(C)]
pub struct kvp_error {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// A paged KV cache (all layers, one block table).
#[repr(C)]
pub struct kvp_cache {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// A decoder: the capacities a decode launch is shaped by, and its workspace.
#[repr(C)]
pub struct kvp_decoder {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// ---------------------------------------------------------------------------
// Enumerations (the C enums; fields and arguments carry them as int32_t)
// ---------------------------------------------------------------------------

/// `kvp_error_code_t`: stable error codes, never renumbered.
pub type kvp_error_code_t = i32;
pub const KVP_OK: kvp_error_code_t = 0;
pub const KVP_ERR_INVALID_ARGUMENT: kvp_error_code_t = 1;
pub const KVP_ERR_OUT_OF_BLOCKS: kvp_error_code_t = 2;
pub const KVP_ERR_OUT_OF_MEMORY: kvp_error_code_t = 3;
pub const KVP_ERR_UNSUPPORTED: kvp_error_code_t = 4;
pub const KVP_ERR_DEVICE: kvp_error_code_t = 5;
pub const KVP_ERR_INTERNAL: kvp_error_code_t = 6;

/// `kvp_dtype_t`: element types of inputs, outputs and the cache.
pub type kvp_dtype_t = i32;
pub const KVP_DTYPE_FP32: kvp_dtype_t = 0;
pub const KVP_DTYPE_FP16: kvp_dtype_t = 1;
pub const KVP_DTYPE_BF16: kvp_dtype_t = 2;
pub const KVP_DTYPE_FP8_E4M3: kvp_dtype_t = 3;
pub const KVP_DTYPE_INT8: kvp_dtype_t = 4;
pub const KVP_DTYPE_INT4: kvp_dtype_t = 5;

/// `kvp_device_kind_t`.
pub type kvp_device_kind_t = i32;
pub const KVP_DEVICE_CPU: kvp_device_kind_t = 0;
pub const KVP_DEVICE_CUDA: kvp_device_kind_t = 1;

// ---------------------------------------------------------------------------
// Structs
// ---------------------------------------------------------------------------

/// Engine-provided memory for a cache (optional).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_allocator {
    pub struct_size: usize,
    pub user_data: *mut c_void,
    pub alloc: Option<unsafe extern "C" fn(*mut c_void, usize, usize, i32, i32) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i32, i32)>,
}

/// Geometry, dtypes and device of a cache; fill with [`kvp_cache_config_init`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_cache_config {
    pub struct_size: usize,
    pub device_kind: i32,
    pub device_ordinal: i32,
    pub num_layers: i32,
    pub num_blocks: i32,
    pub block_size: i32,
    pub num_kv_heads: i32,
    pub head_size: i32,
    pub k_dtype: i32,
    pub v_dtype: i32,
    pub reserved0: i32,
    pub key_smoothing: *const f32,
    pub allocator: *const kvp_allocator,
    /// ABI 1.1: checked mode (0 or 1).
    pub checked: i32,
}

/// Where one layer of a cache lives (pointers in the cache's memory space,
/// strides in bytes); see the header for the addressing formulas.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_layer_layout {
    pub struct_size: usize,
    pub k_data: *mut c_void,
    pub v_data: *mut c_void,
    pub k_scales: *mut c_void,
    pub v_scales: *mut c_void,
    pub k_block_stride: i64,
    pub k_head_stride: i64,
    pub k_chunk_stride: i64,
    pub k_x: i32,
    pub k_chunks: i32,
    pub v_block_stride: i64,
    pub v_head_stride: i64,
    pub v_channel_stride: i64,
    pub k_bits: i32,
    pub v_bits: i32,
    pub k_scale_block_stride: i64,
    pub k_scale_head_stride: i64,
    pub v_scale_block_stride: i64,
    pub v_scale_head_stride: i64,
    pub k_scale_entry_bytes: i32,
    pub v_scale_entry_bytes: i32,
    pub k_data_bytes: i64,
    pub v_data_bytes: i64,
    pub k_scale_bytes: i64,
    pub v_scale_bytes: i64,
}

/// Sizes of a cache as a whole.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_cache_info {
    pub struct_size: usize,
    pub device_kind: i32,
    pub device_ordinal: i32,
    pub num_layers: i32,
    pub num_blocks: i32,
    pub block_size: i32,
    pub num_kv_heads: i32,
    pub head_size: i32,
    pub k_dtype: i32,
    pub v_dtype: i32,
    pub has_key_smoothing: i32,
    pub bytes_per_token_per_layer: i64,
    pub total_bytes: i64,
}

/// Arguments of [`kvp_cache_write`]; fill with [`kvp_write_args_init`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_write_args {
    pub struct_size: usize,
    pub layer: i32,
    pub num_tokens: i32,
    pub input_dtype: i32,
    pub reserved0: i32,
    pub key: *const c_void,
    pub value: *const c_void,
    pub key_token_stride: i64,
    pub value_token_stride: i64,
    pub slot_mapping: *const i64,
}

/// Counters the writes keep.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_write_stats {
    pub struct_size: usize,
    pub non_finite: u64,
    pub saturated: u64,
}

/// Capacities of a decoder; fill with [`kvp_decode_config_init`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_decode_config {
    pub struct_size: usize,
    pub num_query_heads: i32,
    pub max_num_seqs: i32,
    pub max_context_len: i32,
    pub max_query_len: i32,
    pub q_dtype: i32,
    pub out_dtype: i32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    /// ABI 1.2: precise mode (0 or 1): every decode in FP32 from end to end.
    pub precise: i32,
    /// ABI 1.3: query tokens of one [`kvp_attend`] call, all sequences
    /// together; 0 = `max_num_seqs * max_query_len`.
    pub max_query_tokens: i32,
}

/// Arguments of [`kvp_decode`]; fill with [`kvp_decode_args_init`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_decode_args {
    pub struct_size: usize,
    pub layer: i32,
    pub num_seqs: i32,
    pub query_len: i32,
    pub sliding_window: i32,
    pub sm_scale: f32,
    pub logits_soft_cap: f32,
    pub q: *const c_void,
    pub q_token_stride: i64,
    pub block_table: *const i32,
    pub block_table_stride: i64,
    pub block_table_width: i32,
    pub reserved0: i32,
    pub seq_lens: *const i32,
    pub alibi_slopes: *const f32,
    pub out: *mut c_void,
    pub out_token_stride: i64,
    pub lse: *mut f32,
}

/// Arguments of [`kvp_attend`] (first released in ABI 1.3); fill with
/// [`kvp_attend_args_init`]. Sequence `s` owns query tokens
/// `query_starts[s]..query_starts[s + 1]`, the last tokens of its context.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_attend_args {
    pub struct_size: usize,
    pub layer: i32,
    pub num_seqs: i32,
    pub sliding_window: i32,
    pub sm_scale: f32,
    pub logits_soft_cap: f32,
    pub reserved0: i32,
    pub query_starts: *const i32,
    pub q: *const c_void,
    pub q_token_stride: i64,
    pub block_table: *const i32,
    pub block_table_stride: i64,
    pub block_table_width: i32,
    pub reserved1: i32,
    pub seq_lens: *const i32,
    pub alibi_slopes: *const f32,
    pub out: *mut c_void,
    pub out_token_stride: i64,
    pub lse: *mut f32,
}

/// Arguments of [`kvp_cache_pack`] and [`kvp_cache_unpack`] (first released
/// in ABI 1.4); fill with [`kvp_pack_args_init`]. The buffer holds, layer by
/// layer, each region's bytes of the listed blocks (docs/FORMATS.md,
/// "Packed blocks").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_pack_args {
    pub struct_size: usize,
    pub block_ids: *const i32,
    pub num_blocks: i32,
    pub first_layer: i32,
    pub num_layers: i32,
    pub reserved0: i32,
    pub buffer: *mut c_void,
    pub buffer_bytes: u64,
    pub signature: *const c_void,
}

/// The function table for `dlopen` users ([`kvp_get_api`]); append-only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kvp_api {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub version_string: Option<unsafe extern "C" fn() -> *const c_char>,
    pub abi_version: Option<unsafe extern "C" fn(*mut u32, *mut u32)>,
    pub build_info: Option<unsafe extern "C" fn() -> *const c_char>,
    pub error_code: Option<unsafe extern "C" fn(*const kvp_error) -> i32>,
    pub error_message: Option<unsafe extern "C" fn(*const kvp_error) -> *const c_char>,
    pub error_free: Option<unsafe extern "C" fn(*mut kvp_error)>,
    pub error_code_name: Option<unsafe extern "C" fn(i32) -> *const c_char>,
    pub device_count: Option<unsafe extern "C" fn(i32, *mut i32) -> *mut kvp_error>,
    pub allocator_init: Option<unsafe extern "C" fn(*mut kvp_allocator)>,
    pub cache_config_init: Option<unsafe extern "C" fn(*mut kvp_cache_config)>,
    pub cache_create: Option<
        unsafe extern "C" fn(*const kvp_cache_config, *mut *mut kvp_cache) -> *mut kvp_error,
    >,
    pub cache_destroy: Option<unsafe extern "C" fn(*mut kvp_cache)>,
    pub layer_layout_init: Option<unsafe extern "C" fn(*mut kvp_layer_layout)>,
    pub cache_get_layout: Option<
        unsafe extern "C" fn(*const kvp_cache, i32, *mut kvp_layer_layout) -> *mut kvp_error,
    >,
    pub cache_info_init: Option<unsafe extern "C" fn(*mut kvp_cache_info)>,
    pub cache_get_info:
        Option<unsafe extern "C" fn(*const kvp_cache, *mut kvp_cache_info) -> *mut kvp_error>,
    pub seq_create: Option<unsafe extern "C" fn(*mut kvp_cache, *mut i64) -> *mut kvp_error>,
    pub seq_fork: Option<unsafe extern "C" fn(*mut kvp_cache, i64, *mut i64) -> *mut kvp_error>,
    pub seq_append: Option<
        unsafe extern "C" fn(*mut kvp_cache, i64, i32, *mut i64, *mut c_void) -> *mut kvp_error,
    >,
    pub seq_truncate: Option<unsafe extern "C" fn(*mut kvp_cache, i64, i32) -> *mut kvp_error>,
    pub seq_free: Option<unsafe extern "C" fn(*mut kvp_cache, i64) -> *mut kvp_error>,
    pub seq_length: Option<unsafe extern "C" fn(*const kvp_cache, i64, *mut i32) -> *mut kvp_error>,
    pub cache_num_free_blocks:
        Option<unsafe extern "C" fn(*const kvp_cache, *mut i32) -> *mut kvp_error>,
    pub cache_export_block_table: Option<
        unsafe extern "C" fn(
            *const kvp_cache,
            *const i64,
            i32,
            i32,
            i64,
            *mut i32,
            *mut i32,
        ) -> *mut kvp_error,
    >,
    pub write_args_init: Option<unsafe extern "C" fn(*mut kvp_write_args)>,
    pub cache_write: Option<
        unsafe extern "C" fn(*mut kvp_cache, *const kvp_write_args, *mut c_void) -> *mut kvp_error,
    >,
    pub write_stats_init: Option<unsafe extern "C" fn(*mut kvp_write_stats)>,
    pub cache_get_write_stats:
        Option<unsafe extern "C" fn(*const kvp_cache, *mut kvp_write_stats) -> *mut kvp_error>,
    pub cache_reset_write_stats: Option<unsafe extern "C" fn(*mut kvp_cache) -> *mut kvp_error>,
    pub cache_copy_blocks: Option<
        unsafe extern "C" fn(*mut kvp_cache, *const i32, i32, *mut c_void) -> *mut kvp_error,
    >,
    pub cache_transfer_blocks: Option<
        unsafe extern "C" fn(
            *mut kvp_cache,
            *const kvp_cache,
            *const i32,
            i32,
            *mut c_void,
        ) -> *mut kvp_error,
    >,
    pub decode_config_init: Option<unsafe extern "C" fn(*mut kvp_decode_config)>,
    pub decode_workspace_size: Option<
        unsafe extern "C" fn(
            *const kvp_cache,
            *const kvp_decode_config,
            *mut u64,
        ) -> *mut kvp_error,
    >,
    pub decoder_create: Option<
        unsafe extern "C" fn(
            *const kvp_cache,
            *const kvp_decode_config,
            *mut *mut kvp_decoder,
        ) -> *mut kvp_error,
    >,
    pub decoder_destroy: Option<unsafe extern "C" fn(*mut kvp_decoder)>,
    pub decode_args_init: Option<unsafe extern "C" fn(*mut kvp_decode_args)>,
    pub decode: Option<
        unsafe extern "C" fn(
            *mut kvp_decoder,
            *const kvp_decode_args,
            *mut c_void,
        ) -> *mut kvp_error,
    >,
    /// ABI 1.3.
    pub attend_args_init: Option<unsafe extern "C" fn(*mut kvp_attend_args)>,
    /// ABI 1.3.
    pub attend: Option<
        unsafe extern "C" fn(
            *mut kvp_decoder,
            *const kvp_attend_args,
            *mut c_void,
        ) -> *mut kvp_error,
    >,
    /// ABI 1.4.
    pub pack_args_init: Option<unsafe extern "C" fn(*mut kvp_pack_args)>,
    /// ABI 1.4.
    pub cache_pack_size:
        Option<unsafe extern "C" fn(*const kvp_cache, i32, i32, *mut u64) -> *mut kvp_error>,
    /// ABI 1.4.
    pub cache_pack: Option<
        unsafe extern "C" fn(*const kvp_cache, *const kvp_pack_args, *mut c_void) -> *mut kvp_error,
    >,
    /// ABI 1.4.
    pub cache_unpack: Option<
        unsafe extern "C" fn(*mut kvp_cache, *const kvp_pack_args, *mut c_void) -> *mut kvp_error,
    >,
    /// ABI 1.4.
    pub cache_format_signature:
        Option<unsafe extern "C" fn(*const kvp_cache, *mut c_void, usize) -> *mut kvp_error>,
    /// ABI 1.4.
    pub cache_check_signature:
        Option<unsafe extern "C" fn(*const kvp_cache, *const c_void, usize) -> *mut kvp_error>,
}

/// `kvp_get_api_fn`: the type of [`kvp_get_api`], for `dlsym` users.
pub type kvp_get_api_fn = Option<unsafe extern "C" fn(u32) -> *const kvp_api>;

// ---------------------------------------------------------------------------
// Functions (in the header's order)
// ---------------------------------------------------------------------------

extern "C" {
    // Versions
    /// "0.1.0": the package version of the loaded library (static string).
    pub fn kvp_version_string() -> *const c_char;
    /// The ABI version of the loaded library; either pointer may be null.
    pub fn kvp_abi_version(major: *mut u32, minor: *mut u32);
    /// What this build holds, as one line of `key=value` pairs (static string).
    pub fn kvp_build_info() -> *const c_char;

    // Errors
    /// The code of an error; `KVP_OK` for null.
    pub fn kvp_error_code(error: *const kvp_error) -> i32;
    /// The message of an error, valid until [`kvp_error_free`]; "" for null.
    pub fn kvp_error_message(error: *const kvp_error) -> *const c_char;
    /// Releases an error; accepts null.
    pub fn kvp_error_free(error: *mut kvp_error);
    /// "INVALID_ARGUMENT" etc.; "UNKNOWN" for codes this build does not know.
    pub fn kvp_error_code_name(code: i32) -> *const c_char;

    // Devices
    /// 1 for the CPU; the CUDA device count for CUDA (0 without CUDA).
    pub fn kvp_device_count(device_kind: i32, count: *mut i32) -> *mut kvp_error;

    // Cache
    pub fn kvp_allocator_init(allocator: *mut kvp_allocator);
    pub fn kvp_cache_config_init(config: *mut kvp_cache_config);
    pub fn kvp_cache_create(
        config: *const kvp_cache_config,
        cache: *mut *mut kvp_cache,
    ) -> *mut kvp_error;
    /// Accepts null; must not race with any other call on the cache.
    pub fn kvp_cache_destroy(cache: *mut kvp_cache);
    pub fn kvp_layer_layout_init(layout: *mut kvp_layer_layout);
    pub fn kvp_cache_get_layout(
        cache: *const kvp_cache,
        layer: i32,
        layout: *mut kvp_layer_layout,
    ) -> *mut kvp_error;
    pub fn kvp_cache_info_init(info: *mut kvp_cache_info);
    pub fn kvp_cache_get_info(cache: *const kvp_cache, info: *mut kvp_cache_info)
        -> *mut kvp_error;

    // Sequences and block tables (thread-safe: serialized inside the cache)
    pub fn kvp_seq_create(cache: *mut kvp_cache, seq_id: *mut i64) -> *mut kvp_error;
    pub fn kvp_seq_fork(cache: *mut kvp_cache, parent: i64, child: *mut i64) -> *mut kvp_error;
    /// `slots`: host memory for `num_tokens` values, or null.
    pub fn kvp_seq_append(
        cache: *mut kvp_cache,
        seq_id: i64,
        num_tokens: i32,
        slots: *mut i64,
        stream: *mut c_void,
    ) -> *mut kvp_error;
    pub fn kvp_seq_truncate(cache: *mut kvp_cache, seq_id: i64, length: i32) -> *mut kvp_error;
    pub fn kvp_seq_free(cache: *mut kvp_cache, seq_id: i64) -> *mut kvp_error;
    pub fn kvp_seq_length(cache: *const kvp_cache, seq_id: i64, length: *mut i32)
        -> *mut kvp_error;
    pub fn kvp_cache_num_free_blocks(cache: *const kvp_cache, num_free: *mut i32)
        -> *mut kvp_error;
    /// `table` holds `(num_seqs - 1) * row_stride + max_blocks_per_seq`
    /// values; `seq_lens` (may be null) `num_seqs`; both host memory.
    pub fn kvp_cache_export_block_table(
        cache: *const kvp_cache,
        seq_ids: *const i64,
        num_seqs: i32,
        max_blocks_per_seq: i32,
        row_stride: i64,
        table: *mut i32,
        seq_lens: *mut i32,
    ) -> *mut kvp_error;

    // Writing tokens
    pub fn kvp_write_args_init(args: *mut kvp_write_args);
    pub fn kvp_cache_write(
        cache: *mut kvp_cache,
        args: *const kvp_write_args,
        stream: *mut c_void,
    ) -> *mut kvp_error;
    pub fn kvp_write_stats_init(stats: *mut kvp_write_stats);
    pub fn kvp_cache_get_write_stats(
        cache: *const kvp_cache,
        stats: *mut kvp_write_stats,
    ) -> *mut kvp_error;
    pub fn kvp_cache_reset_write_stats(cache: *mut kvp_cache) -> *mut kvp_error;

    // Block copies
    /// `pairs` is in the cache's memory space.
    pub fn kvp_cache_copy_blocks(
        cache: *mut kvp_cache,
        pairs: *const i32,
        num_pairs: i32,
        stream: *mut c_void,
    ) -> *mut kvp_error;
    /// `pairs` is host memory.
    pub fn kvp_cache_transfer_blocks(
        dst: *mut kvp_cache,
        src: *const kvp_cache,
        pairs: *const i32,
        num_pairs: i32,
        stream: *mut c_void,
    ) -> *mut kvp_error;

    // Decode attention
    pub fn kvp_decode_config_init(config: *mut kvp_decode_config);
    pub fn kvp_decode_workspace_size(
        cache: *const kvp_cache,
        config: *const kvp_decode_config,
        bytes: *mut u64,
    ) -> *mut kvp_error;
    /// The decoder must not outlive `cache`.
    pub fn kvp_decoder_create(
        cache: *const kvp_cache,
        config: *const kvp_decode_config,
        decoder: *mut *mut kvp_decoder,
    ) -> *mut kvp_error;
    /// Accepts null.
    pub fn kvp_decoder_destroy(decoder: *mut kvp_decoder);
    pub fn kvp_decode_args_init(args: *mut kvp_decode_args);
    /// Must not run concurrently on one decoder that owns its workspace.
    pub fn kvp_decode(
        decoder: *mut kvp_decoder,
        args: *const kvp_decode_args,
        stream: *mut c_void,
    ) -> *mut kvp_error;

    // Attention over query chunks (varlen), ABI 1.3
    pub fn kvp_attend_args_init(args: *mut kvp_attend_args);
    /// Must not run concurrently on one decoder that owns its workspace.
    pub fn kvp_attend(
        decoder: *mut kvp_decoder,
        args: *const kvp_attend_args,
        stream: *mut c_void,
    ) -> *mut kvp_error;

    // Moving blocks between processes: pack and unpack, ABI 1.4
    pub fn kvp_pack_args_init(args: *mut kvp_pack_args);
    /// Bytes of a buffer of `num_blocks` blocks of `num_layers` layers (0 = all).
    pub fn kvp_cache_pack_size(
        cache: *const kvp_cache,
        num_blocks: i32,
        num_layers: i32,
        bytes: *mut u64,
    ) -> *mut kvp_error;
    /// `block_ids` and `buffer` are in the cache's memory space.
    pub fn kvp_cache_pack(
        cache: *const kvp_cache,
        args: *const kvp_pack_args,
        stream: *mut c_void,
    ) -> *mut kvp_error;
    /// `block_ids` (distinct) and `buffer` are in the cache's memory space.
    pub fn kvp_cache_unpack(
        cache: *mut kvp_cache,
        args: *const kvp_pack_args,
        stream: *mut c_void,
    ) -> *mut kvp_error;
    /// Writes [`KVP_FORMAT_SIGNATURE_BYTES`] bytes of host memory.
    pub fn kvp_cache_format_signature(
        cache: *const kvp_cache,
        signature: *mut c_void,
        signature_bytes: usize,
    ) -> *mut kvp_error;
    /// Fails, naming the first differing field, unless `signature` is this
    /// cache's format.
    pub fn kvp_cache_check_signature(
        cache: *const kvp_cache,
        signature: *const c_void,
        signature_bytes: usize,
    ) -> *mut kvp_error;

    // Function table
    /// The table of ABI major `abi_major`, or null.
    pub fn kvp_get_api(abi_major: u32) -> *const kvp_api;
}
