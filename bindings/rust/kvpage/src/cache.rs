// SPDX-License-Identifier: Apache-2.0
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use kvpage_sys as sys;

use crate::decode::{DecodeConfig, Decoder};
use crate::dtype::{DType, Element};
use crate::error::{check, Error, ErrorCode, Result};

/// Where a cache lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory, the CPU backend.
    Cpu,
    /// Device memory of the CUDA device with this ordinal.
    Cuda(i32),
}

impl Device {
    fn from_raw(kind: i32, ordinal: i32) -> Result<Device> {
        match kind {
            sys::KVP_DEVICE_CPU => Ok(Device::Cpu),
            sys::KVP_DEVICE_CUDA => Ok(Device::Cuda(ordinal)),
            other => Err(Error::new(
                ErrorCode::Internal,
                format!("unknown device_kind {}", other),
            )),
        }
    }
}

/// A CUDA stream (`cudaStream_t`) that asynchronous work is ordered by;
/// ignored by the CPU backend.
///
/// Passing a stream is safe because making one from a raw handle is not:
/// [`Stream::from_raw`] is where the caller promises the handle is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream(*mut c_void);

// SAFETY: a stream handle is a plain value that CUDA accepts from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above; a Stream is never dereferenced on the Rust side.
unsafe impl Sync for Stream {}

impl Stream {
    /// The default (legacy NULL) stream, and the only one the CPU backend
    /// needs.
    pub const DEFAULT: Stream = Stream(ptr::null_mut());

    /// A stream from a raw `cudaStream_t`.
    ///
    /// # Safety
    /// `stream` must be null or a live CUDA stream of the cache's device for
    /// as long as work issued on it runs.
    pub unsafe fn from_raw(stream: *mut c_void) -> Stream {
        Stream(stream)
    }

    /// The raw handle.
    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}

impl Default for Stream {
    fn default() -> Stream {
        Stream::DEFAULT
    }
}

/// The id of a sequence, assigned by the cache (from 1, never reused: a
/// stale id is an error, never another sequence).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(i64);

impl SeqId {
    /// A sequence id from its raw value (e.g. one kept by an engine).
    pub const fn from_raw(id: i64) -> SeqId {
        SeqId(id)
    }

    /// The raw value.
    pub const fn raw(self) -> i64 {
        self.0
    }
}

/// The geometry, dtypes and device of a cache. [`Default`] gives the
/// library's defaults; `num_blocks` and `num_kv_heads` must be set.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// Default [`Device::Cpu`].
    pub device: Device,
    /// `>= 1`; default 1.
    pub num_layers: i32,
    /// `>= 1`; default 0 (must be set).
    pub num_blocks: i32,
    /// Tokens per block: 8, 16 or 32; default 16.
    pub block_size: i32,
    /// `>= 1`; default 0 (must be set).
    pub num_kv_heads: i32,
    /// 64, 80, 96, 112, 128 or 256; default 128.
    pub head_size: i32,
    /// Fp16, Bf16, Fp8E4M3, Int8 or Int4; default Bf16.
    pub k_dtype: DType,
    /// Same set as `k_dtype`; default Bf16.
    pub v_dtype: DType,
    /// Per-channel key smoothing (SmoothAttention): `num_kv_heads *
    /// head_size` positive finite values, `[kv_head][channel]`; copied at
    /// creation.
    pub key_smoothing: Option<Vec<f32>>,
    /// Checked mode: CUDA kernels validate block ids, lengths, slots and
    /// copy pairs read from device memory and report the first bad one as
    /// an error of the next call (the CPU backend always validates).
    /// Default false.
    pub checked: bool,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        let c = raw_cache_config();
        CacheConfig {
            device: Device::from_raw(c.device_kind, c.device_ordinal).unwrap_or(Device::Cpu),
            num_layers: c.num_layers,
            num_blocks: c.num_blocks,
            block_size: c.block_size,
            num_kv_heads: c.num_kv_heads,
            head_size: c.head_size,
            k_dtype: DType::from_raw(c.k_dtype).unwrap_or(DType::Bf16),
            v_dtype: DType::from_raw(c.v_dtype).unwrap_or(DType::Bf16),
            key_smoothing: None,
            checked: c.checked != 0,
        }
    }
}

impl CacheConfig {
    /// The defaults with `num_blocks` and `num_kv_heads` set.
    pub fn new(num_blocks: i32, num_kv_heads: i32) -> CacheConfig {
        CacheConfig {
            num_blocks,
            num_kv_heads,
            ..CacheConfig::default()
        }
    }
}

fn raw_cache_config() -> sys::kvp_cache_config {
    let mut c = MaybeUninit::<sys::kvp_cache_config>::zeroed();
    // SAFETY: kvp_cache_config_init fills the whole struct.
    unsafe {
        sys::kvp_cache_config_init(c.as_mut_ptr());
        c.assume_init()
    }
}

/// Sizes of a cache as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheInfo {
    pub device: Device,
    pub num_layers: i32,
    pub num_blocks: i32,
    pub block_size: i32,
    pub num_kv_heads: i32,
    pub head_size: i32,
    pub k_dtype: DType,
    pub v_dtype: DType,
    pub has_key_smoothing: bool,
    /// Bytes one token occupies in one layer: K + V + scales, all KV heads.
    pub bytes_per_token_per_layer: i64,
    /// Everything the cache allocated.
    pub total_bytes: i64,
}

/// Where one layer of the cache lives, for engines that read or write it
/// themselves (`kvp_layer_layout`; the addressing formulas are in the C
/// header). Pointers are in the cache's memory space and valid while the
/// cache lives; strides are in bytes; scale pointers are null for FP16/BF16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLayout {
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

/// Counters the writes keep over all layers since creation or the last
/// reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// NaN / ±Inf input values (stored as 0).
    pub non_finite: u64,
    /// Finite values clipped to the format's range.
    pub saturated: u64,
}

/// A dense block table for a batch: row `i` (`width` entries) holds the
/// blocks of the `i`-th sequence, entries past its blocks are 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockTable {
    /// `[num_seqs][width]`, row-major.
    pub table: Vec<i32>,
    /// Entries per row.
    pub width: i32,
    /// The sequences' lengths in tokens.
    pub seq_lens: Vec<i32>,
}

/// What [`Cache::write`] writes: `num_tokens = slot_mapping.len()` tokens of
/// K and V from host memory, `key[t * key_token_stride + h * head_size + d]`
/// (same for value), token `t` going to slot `slot_mapping[t]` (`-1` skips
/// it). Quantized caches get one scale per token and KV head.
#[derive(Debug, Clone, Copy)]
pub struct WriteArgs<'a, T: Element> {
    pub layer: i32,
    pub key: &'a [T],
    pub value: &'a [T],
    /// `block * block_size + offset`, or -1 (padding).
    pub slot_mapping: &'a [i64],
    /// Elements between tokens; 0 = `num_kv_heads * head_size` (dense).
    pub key_token_stride: usize,
    /// Elements between tokens; 0 = dense.
    pub value_token_stride: usize,
}

impl<'a, T: Element> WriteArgs<'a, T> {
    /// Dense K and V for `slot_mapping.len()` tokens.
    pub fn new(layer: i32, key: &'a [T], value: &'a [T], slot_mapping: &'a [i64]) -> Self {
        WriteArgs {
            layer,
            key,
            value,
            slot_mapping,
            key_token_stride: 0,
            value_token_stride: 0,
        }
    }
}

/// [`Cache::write_raw`]'s arguments: pointers in the cache's memory space
/// (device pointers for a CUDA cache), as `kvp_write_args`.
#[derive(Debug, Clone, Copy)]
pub struct RawWriteArgs {
    pub layer: i32,
    pub num_tokens: i32,
    pub input_dtype: DType,
    pub key: *const c_void,
    pub value: *const c_void,
    pub key_token_stride: i64,
    pub value_token_stride: i64,
    pub slot_mapping: *const i64,
}

impl Default for RawWriteArgs {
    fn default() -> RawWriteArgs {
        RawWriteArgs {
            layer: 0,
            num_tokens: 0,
            input_dtype: DType::Bf16,
            key: ptr::null(),
            value: ptr::null(),
            key_token_stride: 0,
            value_token_stride: 0,
            slot_mapping: ptr::null(),
        }
    }
}

/// A paged KV cache: `num_layers` layers sharing one block table, its
/// sequences and their blocks.
///
/// A `Cache` is a shared handle: [`Clone`] gives another handle to the same
/// cache, and every [`Decoder`] of the cache holds one. The C cache is
/// destroyed when the last handle is dropped, after every decoder of it
/// (the C API requires that a decoder not outlive its cache), so an engine
/// may keep a cache and its decoders side by side in one struct, in any
/// field order, and move them around together.
///
/// # Threads
///
/// `Cache` is [`Send`] and [`Sync`], as the C header's thread-safety
/// section promises: sequence operations (`create_seq`, `fork_seq`,
/// `append`, `truncate`, `free_seq`, `seq_len`, `block_table`,
/// `num_free_blocks`) may be called from several threads at once and are
/// serialized inside the library; writes, decodes and block copies may be
/// issued from several threads too. `kvp_cache_destroy` must not race with
/// anything: it runs when the last handle is dropped, and every call runs
/// through a live handle, so nothing else can be using the cache then.
///
/// What stays the caller's job (as in C): on the CPU backend, do not write
/// blocks that another thread decodes at the same moment. The cache memory
/// belongs to the library and is never exposed as Rust references, so a
/// violation gives wrong attention values, not out-of-bounds accesses (the
/// CPU backend checks every slot and block id it is given).
///
/// The header's list does not name the remaining calls; this binding treats
/// them as safe to run concurrently too: `info` and `layout` read values
/// fixed at creation, decoder creation only reads the cache, and
/// `write_stats` / `reset_write_stats` touch only the counters, so a read or
/// reset that overlaps writes may miss those writes' counts.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<CacheInner>,
}

/// The C cache and what was read from it at creation; destroyed with the
/// last [`Cache`] handle.
struct CacheInner {
    raw: NonNull<sys::kvp_cache>,
    info: CacheInfo,
}

// SAFETY: a kvp_cache is not tied to the thread that created it (no
// thread-local state; errors are returned objects).
unsafe impl Send for CacheInner {}
// SAFETY: the header states that every operation taking `&self` on a
// `Cache` may be called from several threads at once (see its
// documentation).
unsafe impl Sync for CacheInner {}

impl Drop for CacheInner {
    fn drop(&mut self) {
        // SAFETY: the last handle is gone: no call and no decoder uses the
        // cache any more (each decoder holds a handle until it is destroyed).
        unsafe { sys::kvp_cache_destroy(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("raw", &self.inner.raw)
            .field("info", &self.inner.info)
            .finish()
    }
}

fn to_i32(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| Error::invalid_argument(format!("{} = {} does not fit in int32", what, n)))
}

fn query_info(raw: NonNull<sys::kvp_cache>) -> Result<CacheInfo> {
    let mut i = MaybeUninit::<sys::kvp_cache_info>::zeroed();
    // SAFETY: init fills the struct; get_info writes it.
    let i = unsafe {
        sys::kvp_cache_info_init(i.as_mut_ptr());
        check(sys::kvp_cache_get_info(raw.as_ptr(), i.as_mut_ptr()))?;
        i.assume_init()
    };
    let dtype = |raw: i32| {
        DType::from_raw(raw)
            .ok_or_else(|| Error::new(ErrorCode::Internal, format!("unknown dtype {}", raw)))
    };
    Ok(CacheInfo {
        device: Device::from_raw(i.device_kind, i.device_ordinal)?,
        num_layers: i.num_layers,
        num_blocks: i.num_blocks,
        block_size: i.block_size,
        num_kv_heads: i.num_kv_heads,
        head_size: i.head_size,
        k_dtype: dtype(i.k_dtype)?,
        v_dtype: dtype(i.v_dtype)?,
        has_key_smoothing: i.has_key_smoothing != 0,
        bytes_per_token_per_layer: i.bytes_per_token_per_layer,
        total_bytes: i.total_bytes,
    })
}

impl Cache {
    /// Creates a cache (`kvp_cache_create`). Its memory is zeroed, so a slot
    /// never written decodes to 0.
    pub fn new(config: &CacheConfig) -> Result<Cache> {
        let mut c = raw_cache_config();
        let (kind, ordinal) = match config.device {
            Device::Cpu => (sys::KVP_DEVICE_CPU, 0),
            Device::Cuda(o) => (sys::KVP_DEVICE_CUDA, o),
        };
        c.device_kind = kind;
        c.device_ordinal = ordinal;
        c.num_layers = config.num_layers;
        c.num_blocks = config.num_blocks;
        c.block_size = config.block_size;
        c.num_kv_heads = config.num_kv_heads;
        c.head_size = config.head_size;
        c.k_dtype = config.k_dtype.raw();
        c.v_dtype = config.v_dtype.raw();
        c.checked = i32::from(config.checked);
        if let Some(s) = &config.key_smoothing {
            // The library reads num_kv_heads * head_size values.
            let need = config.num_kv_heads.max(0) as usize * config.head_size.max(0) as usize;
            if s.len() != need {
                return Err(Error::invalid_argument(format!(
                    "config.key_smoothing has {} values, must have num_kv_heads * head_size = {}",
                    s.len(),
                    need
                )));
            }
            c.key_smoothing = s.as_ptr();
        }
        let mut raw = ptr::null_mut();
        // SAFETY: `c` is a filled config; key_smoothing (if any) points to
        // the number of floats the library copies; `raw` is an out-pointer.
        check(unsafe { sys::kvp_cache_create(&c, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::new(ErrorCode::Internal, "kvp_cache_create returned NULL".into())
        })?;
        let mut inner = CacheInner {
            raw,
            info: CacheInfo {
                device: Device::Cpu,
                num_layers: 0,
                num_blocks: 0,
                block_size: 0,
                num_kv_heads: 0,
                head_size: 0,
                k_dtype: DType::Bf16,
                v_dtype: DType::Bf16,
                has_key_smoothing: false,
                bytes_per_token_per_layer: 0,
                total_bytes: 0,
            },
        };
        // On an error `inner` is dropped, which destroys the C cache.
        inner.info = query_info(raw)?;
        Ok(Cache {
            inner: Arc::new(inner),
        })
    }

    /// Whether `a` and `b` are handles to the same cache.
    pub fn ptr_eq(a: &Cache, b: &Cache) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    /// The cache's sizes (`kvp_cache_get_info`, read once at creation).
    pub fn info(&self) -> &CacheInfo {
        &self.inner.info
    }

    /// The raw handle, for calls into `kvpage-sys`. It stays owned by the
    /// handles of the cache and is valid while any of them lives.
    pub fn as_raw(&self) -> *mut sys::kvp_cache {
        self.inner.raw.as_ptr()
    }

    /// Operations that take host slices for data "in the cache's memory
    /// space" are only safe on a CPU cache.
    pub(crate) fn require_host(&self, what: &str) -> Result<()> {
        match self.inner.info.device {
            Device::Cpu => Ok(()),
            Device::Cuda(_) => Err(Error::invalid_argument(format!(
                "{}: host slices need a CPU cache, this one is on {:?} (use the *_raw call \
                 with device pointers)",
                what, self.inner.info.device
            ))),
        }
    }

    /// Where layer `layer` lives (`kvp_cache_get_layout`).
    pub fn layout(&self, layer: i32) -> Result<LayerLayout> {
        let mut l = MaybeUninit::<sys::kvp_layer_layout>::zeroed();
        // SAFETY: init fills the struct; get_layout writes it.
        let l = unsafe {
            sys::kvp_layer_layout_init(l.as_mut_ptr());
            check(sys::kvp_cache_get_layout(
                self.inner.raw.as_ptr(),
                layer,
                l.as_mut_ptr(),
            ))?;
            l.assume_init()
        };
        Ok(LayerLayout {
            k_data: l.k_data,
            v_data: l.v_data,
            k_scales: l.k_scales,
            v_scales: l.v_scales,
            k_block_stride: l.k_block_stride,
            k_head_stride: l.k_head_stride,
            k_chunk_stride: l.k_chunk_stride,
            k_x: l.k_x,
            k_chunks: l.k_chunks,
            v_block_stride: l.v_block_stride,
            v_head_stride: l.v_head_stride,
            v_channel_stride: l.v_channel_stride,
            k_bits: l.k_bits,
            v_bits: l.v_bits,
            k_scale_block_stride: l.k_scale_block_stride,
            k_scale_head_stride: l.k_scale_head_stride,
            v_scale_block_stride: l.v_scale_block_stride,
            v_scale_head_stride: l.v_scale_head_stride,
            k_scale_entry_bytes: l.k_scale_entry_bytes,
            v_scale_entry_bytes: l.v_scale_entry_bytes,
            k_data_bytes: l.k_data_bytes,
            v_data_bytes: l.v_data_bytes,
            k_scale_bytes: l.k_scale_bytes,
            v_scale_bytes: l.v_scale_bytes,
        })
    }

    // ---- Sequences -----------------------------------------------------------

    /// Creates an empty sequence.
    pub fn create_seq(&self) -> Result<SeqId> {
        let mut id = 0i64;
        // SAFETY: live handle, out-pointer.
        check(unsafe { sys::kvp_seq_create(self.inner.raw.as_ptr(), &mut id) })?;
        Ok(SeqId(id))
    }

    /// Creates a sequence sharing every block of `parent` (prefix sharing);
    /// the first append to a shared, partly filled block copies it first.
    pub fn fork_seq(&self, parent: SeqId) -> Result<SeqId> {
        let mut id = 0i64;
        // SAFETY: live handle, out-pointer.
        check(unsafe { sys::kvp_seq_fork(self.inner.raw.as_ptr(), parent.0, &mut id) })?;
        Ok(SeqId(id))
    }

    /// Appends `num_tokens` tokens to `seq`, allocating blocks as needed, and
    /// returns their slots (`block * block_size + offset`). A copy-on-write
    /// runs on the default stream. Too few free blocks:
    /// [`ErrorCode::OutOfBlocks`], and nothing changes.
    pub fn append(&self, seq: SeqId, num_tokens: usize) -> Result<Vec<i64>> {
        let mut slots = vec![0i64; num_tokens];
        self.append_into(seq, &mut slots, Stream::DEFAULT)?;
        Ok(slots)
    }

    /// Appends `slots.len()` tokens and writes their slots into `slots`; a
    /// copy-on-write runs on `stream` before the call returns.
    pub fn append_into(&self, seq: SeqId, slots: &mut [i64], stream: Stream) -> Result<()> {
        let n = to_i32(slots.len(), "slots.len()")?;
        // SAFETY: the library writes n values into `slots`.
        check(unsafe {
            sys::kvp_seq_append(
                self.inner.raw.as_ptr(),
                seq.0,
                n,
                slots.as_mut_ptr(),
                stream.0,
            )
        })
    }

    /// Shortens `seq` to `length` tokens, releasing blocks it no longer needs.
    pub fn truncate(&self, seq: SeqId, length: i32) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvp_seq_truncate(self.inner.raw.as_ptr(), seq.0, length) })
    }

    /// Releases `seq` and its references to blocks.
    pub fn free_seq(&self, seq: SeqId) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvp_seq_free(self.inner.raw.as_ptr(), seq.0) })
    }

    /// The length of `seq` in tokens.
    pub fn seq_len(&self, seq: SeqId) -> Result<i32> {
        let mut n = 0;
        // SAFETY: live handle, out-pointer.
        check(unsafe { sys::kvp_seq_length(self.inner.raw.as_ptr(), seq.0, &mut n) })?;
        Ok(n)
    }

    /// Blocks not held by any sequence.
    pub fn num_free_blocks(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: live handle, out-pointer.
        check(unsafe { sys::kvp_cache_num_free_blocks(self.inner.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// The dense block table of a batch, `width` blocks per row.
    pub fn block_table(&self, seqs: &[SeqId], width: i32) -> Result<BlockTable> {
        if width < 1 {
            return Err(Error::invalid_argument(format!(
                "width = {}, must be >= 1",
                width
            )));
        }
        let mut table = vec![0i32; seqs.len() * width as usize];
        let mut seq_lens = vec![0i32; seqs.len()];
        self.export_block_table(seqs, width, width as usize, &mut table, Some(&mut seq_lens))?;
        Ok(BlockTable {
            table,
            width,
            seq_lens,
        })
    }

    /// Writes a batch's block table into `table`
    /// (`table[i * row_stride + j]`, `j < max_blocks_per_seq`) and, when
    /// given, the lengths into `seq_lens` (`kvp_cache_export_block_table`).
    pub fn export_block_table(
        &self,
        seqs: &[SeqId],
        max_blocks_per_seq: i32,
        row_stride: usize,
        table: &mut [i32],
        seq_lens: Option<&mut [i32]>,
    ) -> Result<()> {
        let n = to_i32(seqs.len(), "seqs.len()")?;
        if n > 0 && max_blocks_per_seq >= 1 && row_stride >= max_blocks_per_seq as usize {
            let need = (seqs.len() - 1) * row_stride + max_blocks_per_seq as usize;
            if table.len() < need {
                return Err(Error::invalid_argument(format!(
                    "table has {} entries, needs (num_seqs - 1) * row_stride + \
                     max_blocks_per_seq = {}",
                    table.len(),
                    need
                )));
            }
        }
        let lens_ptr = match seq_lens {
            Some(l) if l.len() < seqs.len() => {
                return Err(Error::invalid_argument(format!(
                    "seq_lens has {} entries, needs num_seqs = {}",
                    l.len(),
                    seqs.len()
                )))
            }
            Some(l) => l.as_mut_ptr(),
            None => ptr::null_mut(),
        };
        let stride = i64::try_from(row_stride).map_err(|_| {
            Error::invalid_argument(format!("row_stride = {} is too large", row_stride))
        })?;
        // SAFETY: SeqId is repr(transparent) over i64; the lengths of
        // `table` and `seq_lens` were checked above (the library checks
        // max_blocks_per_seq and row_stride itself before writing).
        check(unsafe {
            sys::kvp_cache_export_block_table(
                self.inner.raw.as_ptr(),
                seqs.as_ptr() as *const i64,
                n,
                max_blocks_per_seq,
                stride,
                table.as_mut_ptr(),
                lens_ptr,
            )
        })
    }

    // ---- Writes ----------------------------------------------------------------

    /// Writes (quantizing) K and V of host memory into a CPU cache. Non-finite
    /// inputs are stored as 0 and counted; values beyond the format's range
    /// saturate and are counted ([`Cache::write_stats`]).
    pub fn write<T: Element>(&self, args: &WriteArgs<'_, T>) -> Result<()> {
        self.require_host("write")?;
        let n = to_i32(args.slot_mapping.len(), "slot_mapping.len()")?;
        let dense = self.inner.info.num_kv_heads as usize * self.inner.info.head_size as usize;
        for (name, data, stride) in [
            ("key", args.key, args.key_token_stride),
            ("value", args.value, args.value_token_stride),
        ] {
            let stride = if stride == 0 { dense } else { stride };
            if stride < dense {
                return Err(Error::invalid_argument(format!(
                    "{}_token_stride = {}, must be 0 or >= num_kv_heads * head_size = {}",
                    name, stride, dense
                )));
            }
            let need = if n == 0 {
                0
            } else {
                (n as usize - 1) * stride + dense
            };
            if data.len() < need {
                return Err(Error::invalid_argument(format!(
                    "{} has {} elements, {} tokens need {}",
                    name,
                    data.len(),
                    n,
                    need
                )));
            }
        }
        let raw = RawWriteArgs {
            layer: args.layer,
            num_tokens: n,
            input_dtype: T::DTYPE,
            key: args.key.as_ptr() as *const c_void,
            value: args.value.as_ptr() as *const c_void,
            key_token_stride: args.key_token_stride as i64,
            value_token_stride: args.value_token_stride as i64,
            slot_mapping: args.slot_mapping.as_ptr(),
        };
        // SAFETY: host cache; every pointer covers what the library reads
        // for n tokens at these strides (checked above); the CPU backend
        // checks every slot against the cache's size.
        unsafe { self.write_raw(&raw, Stream::DEFAULT) }
    }

    /// Writes K and V through raw pointers (`kvp_cache_write`), for CUDA
    /// caches and device memory. Launches on `stream` without synchronizing.
    ///
    /// # Safety
    /// `key`, `value` and `slot_mapping` must be in the cache's memory space
    /// and cover `num_tokens` tokens at the given strides until the write has
    /// run (on the stream), and every slot must be -1 or below
    /// `num_blocks * block_size` (the CUDA backend cannot check slots that
    /// live in device memory).
    pub unsafe fn write_raw(&self, args: &RawWriteArgs, stream: Stream) -> Result<()> {
        let mut a = MaybeUninit::<sys::kvp_write_args>::zeroed();
        sys::kvp_write_args_init(a.as_mut_ptr());
        let mut a = a.assume_init();
        a.layer = args.layer;
        a.num_tokens = args.num_tokens;
        a.input_dtype = args.input_dtype.raw();
        a.key = args.key;
        a.value = args.value;
        a.key_token_stride = args.key_token_stride;
        a.value_token_stride = args.value_token_stride;
        a.slot_mapping = args.slot_mapping;
        check(sys::kvp_cache_write(self.inner.raw.as_ptr(), &a, stream.0))
    }

    /// The write counters (synchronizes with the cache's device).
    pub fn write_stats(&self) -> Result<WriteStats> {
        let mut s = MaybeUninit::<sys::kvp_write_stats>::zeroed();
        // SAFETY: init fills the struct; get_write_stats writes it.
        let s = unsafe {
            sys::kvp_write_stats_init(s.as_mut_ptr());
            check(sys::kvp_cache_get_write_stats(
                self.inner.raw.as_ptr(),
                s.as_mut_ptr(),
            ))?;
            s.assume_init()
        };
        Ok(WriteStats {
            non_finite: s.non_finite,
            saturated: s.saturated,
        })
    }

    /// Sets the write counters to zero.
    pub fn reset_write_stats(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvp_cache_reset_write_stats(self.inner.raw.as_ptr()) })
    }

    // ---- Block copies ----------------------------------------------------------------

    /// Copies block `p[0]` to block `p[1]` for each pair, in every layer, data
    /// and scales together (CPU cache; destinations distinct and not also
    /// sources).
    pub fn copy_blocks(&self, pairs: &[[i32; 2]]) -> Result<()> {
        self.require_host("copy_blocks")?;
        let n = to_i32(pairs.len(), "pairs.len()")?;
        // SAFETY: host cache and host pairs; the CPU backend validates ids.
        unsafe { self.copy_blocks_raw(pairs.as_ptr() as *const i32, n, Stream::DEFAULT) }
    }

    /// `kvp_cache_copy_blocks` with `pairs` in the cache's memory space.
    ///
    /// # Safety
    /// `pairs` must point to `2 * num_pairs` valid block ids in the cache's
    /// memory space (device memory for a CUDA cache) until the copy has run.
    pub unsafe fn copy_blocks_raw(
        &self,
        pairs: *const i32,
        num_pairs: i32,
        stream: Stream,
    ) -> Result<()> {
        check(sys::kvp_cache_copy_blocks(
            self.inner.raw.as_ptr(),
            pairs,
            num_pairs,
            stream.0,
        ))
    }

    /// Copies block `p[0]` of `src` to block `p[1]` of `self` for each pair
    /// (two caches of one geometry, e.g. a GPU cache and its CPU swap space).
    /// `pairs` is host memory; the copies are ordered by `stream`.
    pub fn transfer_blocks_from(
        &self,
        src: &Cache,
        pairs: &[[i32; 2]],
        stream: Stream,
    ) -> Result<()> {
        let n = to_i32(pairs.len(), "pairs.len()")?;
        // SAFETY: host pairs, checked by the library against both caches.
        check(unsafe {
            sys::kvp_cache_transfer_blocks(
                self.inner.raw.as_ptr(),
                src.inner.raw.as_ptr(),
                pairs.as_ptr() as *const i32,
                n,
                stream.0,
            )
        })
    }

    // ---- Decoding ------------------------------------------------------------------

    /// The workspace a decoder with `config` needs (0 on the CPU backend).
    pub fn decode_workspace_size(&self, config: &DecodeConfig) -> Result<u64> {
        let c = config.to_raw();
        let mut bytes = 0u64;
        // SAFETY: live handle, filled config, out-pointer.
        check(unsafe { sys::kvp_decode_workspace_size(self.inner.raw.as_ptr(), &c, &mut bytes) })?;
        Ok(bytes)
    }

    /// A decoder for this cache with the capacities of `config`
    /// (same as [`Decoder::new`]). It holds a handle of the cache.
    pub fn decoder(&self, config: &DecodeConfig) -> Result<Decoder> {
        Decoder::new(self, config)
    }
}
