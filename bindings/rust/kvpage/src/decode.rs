// SPDX-License-Identifier: Apache-2.0
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};

use kvpage_sys as sys;

use crate::cache::{BlockTable, Cache, Stream};
use crate::dtype::{DType, Element};
use crate::error::{check, Error, ErrorCode, Result};

/// The capacities a decoder's launches are shaped by (so that one CUDA graph
/// serves every batch within them), and its query and output types.
/// [`Default`] gives the library's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeConfig {
    /// A multiple of the cache's `num_kv_heads`; default 0 (must be set).
    pub num_query_heads: i32,
    /// Default 0 (must be set).
    pub max_num_seqs: i32,
    /// Tokens; default 0 (must be set).
    pub max_context_len: i32,
    /// Query tokens per sequence (speculative decoding); default 1.
    pub max_query_len: i32,
    /// Fp32, Fp16 or Bf16; default Bf16.
    pub q_dtype: DType,
    /// Fp32, Fp16 or Bf16; default Bf16.
    pub out_dtype: DType,
    /// Precise mode: every decode of this decoder computes in FP32 from end
    /// to end, queries included, so that the LSE is accurate to FP32
    /// rounding (for engines that merge partial results by their LSE). On
    /// CUDA it runs the CUDA-core kernel, slower for GQA groups and
    /// quantized caches; the CPU backend is precise either way. Default
    /// false.
    pub precise: bool,
    /// Query tokens of one [`Decoder::attend`] call, all sequences together
    /// (the capacity its launches are shaped by); default 0 =
    /// `max_num_seqs * max_query_len`.
    pub max_query_tokens: i32,
}

fn raw_decode_config() -> sys::kvp_decode_config {
    let mut c = MaybeUninit::<sys::kvp_decode_config>::zeroed();
    // SAFETY: init fills the whole struct.
    unsafe {
        sys::kvp_decode_config_init(c.as_mut_ptr());
        c.assume_init()
    }
}

impl Default for DecodeConfig {
    fn default() -> DecodeConfig {
        let c = raw_decode_config();
        DecodeConfig {
            num_query_heads: c.num_query_heads,
            max_num_seqs: c.max_num_seqs,
            max_context_len: c.max_context_len,
            max_query_len: c.max_query_len,
            q_dtype: DType::from_raw(c.q_dtype).unwrap_or(DType::Bf16),
            out_dtype: DType::from_raw(c.out_dtype).unwrap_or(DType::Bf16),
            precise: c.precise != 0,
            max_query_tokens: c.max_query_tokens,
        }
    }
}

impl DecodeConfig {
    /// The defaults with the three capacities set.
    pub fn new(num_query_heads: i32, max_num_seqs: i32, max_context_len: i32) -> DecodeConfig {
        DecodeConfig {
            num_query_heads,
            max_num_seqs,
            max_context_len,
            ..DecodeConfig::default()
        }
    }

    pub(crate) fn to_raw(&self) -> sys::kvp_decode_config {
        let mut c = raw_decode_config();
        c.num_query_heads = self.num_query_heads;
        c.max_num_seqs = self.max_num_seqs;
        c.max_context_len = self.max_context_len;
        c.max_query_len = self.max_query_len;
        c.q_dtype = self.q_dtype.raw();
        c.out_dtype = self.out_dtype.raw();
        c.precise = i32::from(self.precise);
        c.max_query_tokens = self.max_query_tokens;
        c
    }

    /// The query tokens one [`Decoder::attend`] call may bring:
    /// `max_query_tokens`, or `max_num_seqs * max_query_len` where it is 0.
    pub fn query_token_capacity(&self) -> i64 {
        if self.max_query_tokens != 0 {
            i64::from(self.max_query_tokens)
        } else {
            i64::from(self.max_num_seqs) * i64::from(self.max_query_len)
        }
    }
}

/// What [`Decoder::decode`] attends: for sequence `s` (`s <
/// seq_lens.len()`), query token `i < query_len` and query head `h`,
/// `q[(s * query_len + i) * q_token_stride + h * head_size + d]` against the
/// first `seq_lens[s]` tokens named by row `s` of `block_table`
/// (`block_table[s * block_table_stride + j]`, `j < block_table_width`).
/// Host memory; see `kvp_decode_args` in the C header for the exact
/// definition (ALiBi, sliding window, soft-cap, causal query tokens).
#[derive(Debug, Clone, Copy)]
pub struct DecodeArgs<'a, Q: Element> {
    pub layer: i32,
    pub q: &'a [Q],
    /// Elements between query tokens; 0 = `num_query_heads * head_size`.
    pub q_token_stride: usize,
    /// Query tokens per sequence, `1..=max_query_len`.
    pub query_len: i32,
    pub block_table: &'a [i32],
    pub block_table_width: i32,
    /// Elements between rows; 0 = `block_table_width`.
    pub block_table_stride: usize,
    /// One length per sequence of the batch.
    pub seq_lens: &'a [i32],
    /// Tokens attended per query, 0 = all.
    pub sliding_window: i32,
    /// 0 = `1 / sqrt(head_size)`.
    pub sm_scale: f32,
    /// 0 = off.
    pub logits_soft_cap: f32,
    /// One slope per query head.
    pub alibi_slopes: Option<&'a [f32]>,
}

impl<'a, Q: Element> DecodeArgs<'a, Q> {
    /// One query token per sequence of `table`, no options.
    pub fn new(layer: i32, q: &'a [Q], table: &'a BlockTable) -> Self {
        DecodeArgs {
            layer,
            q,
            q_token_stride: 0,
            query_len: 1,
            block_table: &table.table,
            block_table_width: table.width,
            block_table_stride: 0,
            seq_lens: &table.seq_lens,
            sliding_window: 0,
            sm_scale: 0.0,
            logits_soft_cap: 0.0,
            alibi_slopes: None,
        }
    }
}

/// [`Decoder::decode_raw`]'s arguments, as `kvp_decode_args`: pointers in the
/// cache's memory space (device pointers for a CUDA cache).
#[derive(Debug, Clone, Copy)]
pub struct RawDecodeArgs {
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
    pub seq_lens: *const i32,
    pub alibi_slopes: *const f32,
    pub out: *mut c_void,
    pub out_token_stride: i64,
    pub lse: *mut f32,
}

impl Default for RawDecodeArgs {
    fn default() -> RawDecodeArgs {
        RawDecodeArgs {
            layer: 0,
            num_seqs: 0,
            query_len: 1,
            sliding_window: 0,
            sm_scale: 0.0,
            logits_soft_cap: 0.0,
            q: ptr::null(),
            q_token_stride: 0,
            block_table: ptr::null(),
            block_table_stride: 0,
            block_table_width: 0,
            seq_lens: ptr::null(),
            alibi_slopes: ptr::null(),
            out: ptr::null_mut(),
            out_token_stride: 0,
            lse: ptr::null_mut(),
        }
    }
}

/// What [`Decoder::attend`] attends: a batch whose sequences each bring
/// their own number of query tokens. Sequence `s` (`s < seq_lens.len()`)
/// owns query tokens `query_starts[s]..query_starts[s + 1]`, the last
/// `n_s = query_starts[s + 1] - query_starts[s]` tokens of its context of
/// `seq_lens[s]` tokens (`n_s <= seq_lens[s]`); token `i` of the chunk sits
/// at position `seq_lens[s] - n_s + i` and attends as [`Decoder::decode`]'s
/// query token at that position does. Token `t` is
/// `q[t * q_token_stride + h * head_size + d]`. Host memory; see
/// `kvp_attend_args` in the C header.
#[derive(Debug, Clone, Copy)]
pub struct AttendArgs<'a, Q: Element> {
    pub layer: i32,
    pub q: &'a [Q],
    /// Elements between query tokens; 0 = `num_query_heads * head_size`.
    pub q_token_stride: usize,
    /// `seq_lens.len() + 1` offsets, 0 first, non-decreasing, the last at
    /// most the decoder's `max_query_tokens`.
    pub query_starts: &'a [i32],
    pub block_table: &'a [i32],
    pub block_table_width: i32,
    /// Elements between rows; 0 = `block_table_width`.
    pub block_table_stride: usize,
    /// One context length per sequence, its new tokens included.
    pub seq_lens: &'a [i32],
    /// Tokens attended per query, 0 = all.
    pub sliding_window: i32,
    /// 0 = `1 / sqrt(head_size)`.
    pub sm_scale: f32,
    /// 0 = off.
    pub logits_soft_cap: f32,
    /// One slope per query head.
    pub alibi_slopes: Option<&'a [f32]>,
}

impl<'a, Q: Element> AttendArgs<'a, Q> {
    /// The sequences of `table`, their query tokens split by `query_starts`,
    /// no options.
    pub fn new(layer: i32, q: &'a [Q], query_starts: &'a [i32], table: &'a BlockTable) -> Self {
        AttendArgs {
            layer,
            q,
            q_token_stride: 0,
            query_starts,
            block_table: &table.table,
            block_table_width: table.width,
            block_table_stride: 0,
            seq_lens: &table.seq_lens,
            sliding_window: 0,
            sm_scale: 0.0,
            logits_soft_cap: 0.0,
            alibi_slopes: None,
        }
    }
}

/// [`Decoder::attend_raw`]'s arguments, as `kvp_attend_args`: pointers in
/// the cache's memory space (device pointers for a CUDA cache).
#[derive(Debug, Clone, Copy)]
pub struct RawAttendArgs {
    pub layer: i32,
    pub num_seqs: i32,
    pub sliding_window: i32,
    pub sm_scale: f32,
    pub logits_soft_cap: f32,
    pub query_starts: *const i32,
    pub q: *const c_void,
    pub q_token_stride: i64,
    pub block_table: *const i32,
    pub block_table_stride: i64,
    pub block_table_width: i32,
    pub seq_lens: *const i32,
    pub alibi_slopes: *const f32,
    pub out: *mut c_void,
    pub out_token_stride: i64,
    pub lse: *mut f32,
}

impl Default for RawAttendArgs {
    fn default() -> RawAttendArgs {
        RawAttendArgs {
            layer: 0,
            num_seqs: 0,
            sliding_window: 0,
            sm_scale: 0.0,
            logits_soft_cap: 0.0,
            query_starts: ptr::null(),
            q: ptr::null(),
            q_token_stride: 0,
            block_table: ptr::null(),
            block_table_stride: 0,
            block_table_width: 0,
            seq_lens: ptr::null(),
            alibi_slopes: ptr::null(),
            out: ptr::null_mut(),
            out_token_stride: 0,
            lse: ptr::null_mut(),
        }
    }
}

/// Runs decode attention over a cache with fixed capacities.
///
/// A decoder holds a handle of its [`Cache`], so it owns no borrow: an
/// engine may keep the cache and its decoders in one struct. The C decoder
/// is destroyed when the decoder is dropped, before that handle is
/// released, so the C cache always outlives it.
///
/// # Threads
///
/// `Decoder` is [`Send`] but not [`Sync`]: the header forbids running
/// `kvp_decode` on one decoder from two threads at once (its workspace would
/// be shared), so [`Decoder::decode`] takes `&mut self`. Use one decoder per
/// thread (or stream); several decoders may share one cache.
pub struct Decoder {
    raw: NonNull<sys::kvp_decoder>,
    config: DecodeConfig,
    // Keeps the C cache alive; released after `raw` is destroyed (Drop runs
    // before the fields are dropped).
    cache: Cache,
}

// SAFETY: a kvp_decoder is not tied to a thread, and the Cache it holds is
// Send.
unsafe impl Send for Decoder {}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("raw", &self.raw)
            .field("config", &self.config)
            .finish()
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: we own the handle; `self.cache` keeps the C cache alive
        // until after this call.
        unsafe { sys::kvp_decoder_destroy(self.raw.as_ptr()) }
    }
}

impl Decoder {
    /// A decoder that owns its workspace (`kvp_decoder_create`); it holds a
    /// handle of `cache`.
    pub fn new(cache: &Cache, config: &DecodeConfig) -> Result<Decoder> {
        // SAFETY: a null workspace means the decoder allocates its own.
        unsafe { Decoder::with_workspace(cache, config, ptr::null_mut(), 0) }
    }

    /// A decoder using a caller-owned workspace of at least
    /// [`Cache::decode_workspace_size`] bytes, 256-byte aligned, in the
    /// cache's memory space.
    ///
    /// # Safety
    /// `workspace` must stay valid, and be used by nothing else, for the
    /// decoder's life.
    pub unsafe fn with_workspace(
        cache: &Cache,
        config: &DecodeConfig,
        workspace: *mut c_void,
        workspace_bytes: u64,
    ) -> Result<Decoder> {
        let mut c = config.to_raw();
        c.workspace = workspace;
        c.workspace_bytes = workspace_bytes;
        let mut raw = ptr::null_mut();
        check(sys::kvp_decoder_create(cache.as_raw(), &c, &mut raw))?;
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::new(
                ErrorCode::Internal,
                "kvp_decoder_create returned NULL".into(),
            )
        })?;
        Ok(Decoder {
            raw,
            config: config.clone(),
            cache: cache.clone(),
        })
    }

    /// The configuration the decoder was created with.
    pub fn config(&self) -> &DecodeConfig {
        &self.config
    }

    /// The cache the decoder reads (clone it for a handle of one's own).
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Decodes a batch held in host memory (CPU cache) into `out`
    /// (`[num_seqs * query_len][num_query_heads][head_size]`, dense) and,
    /// when given, `lse` (`[num_seqs][query_len][num_query_heads]`). `Q` and
    /// `O` must be the decoder's `q_dtype` and `out_dtype`.
    pub fn decode<Q: Element, O: Element>(
        &mut self,
        args: &DecodeArgs<'_, Q>,
        out: &mut [O],
        lse: Option<&mut [f32]>,
    ) -> Result<()> {
        self.cache.require_host("decode")?;
        let bad = |m: String| Err(Error::invalid_argument(m));
        if Q::DTYPE != self.config.q_dtype {
            return bad(format!(
                "q: elements are {:?}, the decoder was created with q_dtype {:?}",
                Q::DTYPE,
                self.config.q_dtype
            ));
        }
        if O::DTYPE != self.config.out_dtype {
            return bad(format!(
                "out: elements are {:?}, the decoder was created with out_dtype {:?}",
                O::DTYPE,
                self.config.out_dtype
            ));
        }
        let info = self.cache.info();
        let num_seqs = i32::try_from(args.seq_lens.len())
            .map_err(|_| Error::invalid_argument("seq_lens is too long".into()))?;
        if args.query_len < 1 {
            return bad(format!("query_len = {}, must be >= 1", args.query_len));
        }
        if args.block_table_width < 1 {
            return bad(format!(
                "block_table_width = {}, must be >= 1",
                args.block_table_width
            ));
        }
        let rows = args.seq_lens.len() * args.query_len as usize;
        let heads = self.config.num_query_heads.max(0) as usize;
        let dense = heads * info.head_size as usize;
        let q_stride = if args.q_token_stride == 0 {
            dense
        } else {
            args.q_token_stride
        };
        let width = args.block_table_width as usize;
        let t_stride = if args.block_table_stride == 0 {
            width
        } else {
            args.block_table_stride
        };
        if q_stride < dense {
            return bad(format!(
                "q_token_stride = {}, must be 0 or >= num_query_heads * head_size = {}",
                q_stride, dense
            ));
        }
        if t_stride < width {
            return bad(format!(
                "block_table_stride = {}, must be 0 or >= block_table_width = {}",
                t_stride, width
            ));
        }
        if rows > 0 {
            let checks = [
                ("q", args.q.len(), (rows - 1) * q_stride + dense),
                ("out", out.len(), rows * dense),
                (
                    "block_table",
                    args.block_table.len(),
                    (args.seq_lens.len() - 1) * t_stride + width,
                ),
            ];
            for (name, have, need) in checks {
                if have < need {
                    return bad(format!(
                        "{} has {} elements, needs {} for {} sequences x {} query tokens",
                        name, have, need, num_seqs, args.query_len
                    ));
                }
            }
            if let Some(l) = &lse {
                if l.len() < rows * heads {
                    return bad(format!(
                        "lse has {} elements, needs {}",
                        l.len(),
                        rows * heads
                    ));
                }
            }
        }
        if let Some(a) = args.alibi_slopes {
            if a.len() < heads {
                return bad(format!(
                    "alibi_slopes has {} values, needs num_query_heads = {}",
                    a.len(),
                    heads
                ));
            }
        }
        let raw = RawDecodeArgs {
            layer: args.layer,
            num_seqs,
            query_len: args.query_len,
            sliding_window: args.sliding_window,
            sm_scale: args.sm_scale,
            logits_soft_cap: args.logits_soft_cap,
            q: args.q.as_ptr() as *const c_void,
            q_token_stride: q_stride as i64,
            block_table: args.block_table.as_ptr(),
            block_table_stride: t_stride as i64,
            block_table_width: args.block_table_width,
            seq_lens: args.seq_lens.as_ptr(),
            alibi_slopes: args.alibi_slopes.map_or(ptr::null(), |a| a.as_ptr()),
            out: out.as_mut_ptr() as *mut c_void,
            out_token_stride: 0,
            lse: lse.map_or(ptr::null_mut(), |l| l.as_mut_ptr()),
        };
        // SAFETY: host cache; every buffer covers what the library reads or
        // writes for these sizes (checked above); the CPU backend checks
        // every length against max_context_len and the table width, and
        // every block id it reads against num_blocks.
        unsafe { self.decode_raw(&raw, Stream::DEFAULT) }
    }

    /// `kvp_decode` with raw pointers, for CUDA caches and device memory:
    /// launches on `stream` without allocating or synchronizing.
    ///
    /// # Safety
    /// Every pointer must be in the cache's memory space and cover what the
    /// header's definition reads or writes for these sizes until the decode
    /// has run; the block table's ids must be below `num_blocks` and the
    /// lengths within `max_context_len` and the table (the CUDA backend
    /// cannot check values that live in device memory).
    pub unsafe fn decode_raw(&mut self, args: &RawDecodeArgs, stream: Stream) -> Result<()> {
        let mut a = MaybeUninit::<sys::kvp_decode_args>::zeroed();
        sys::kvp_decode_args_init(a.as_mut_ptr());
        let mut a = a.assume_init();
        a.layer = args.layer;
        a.num_seqs = args.num_seqs;
        a.query_len = args.query_len;
        a.sliding_window = args.sliding_window;
        a.sm_scale = args.sm_scale;
        a.logits_soft_cap = args.logits_soft_cap;
        a.q = args.q;
        a.q_token_stride = args.q_token_stride;
        a.block_table = args.block_table;
        a.block_table_stride = args.block_table_stride;
        a.block_table_width = args.block_table_width;
        a.seq_lens = args.seq_lens;
        a.alibi_slopes = args.alibi_slopes;
        a.out = args.out;
        a.out_token_stride = args.out_token_stride;
        a.lse = args.lse;
        check(sys::kvp_decode(self.raw.as_ptr(), &a, stream.as_raw()))
    }

    /// Attention over query chunks of varying lengths (`kvp_attend`) held in
    /// host memory (CPU cache): writes `out`
    /// (`[query_starts[num_seqs]][num_query_heads][head_size]`, dense) and,
    /// when given, `lse` (`[query_starts[num_seqs]][num_query_heads]`). `Q`
    /// and `O` must be the decoder's `q_dtype` and `out_dtype`. The library
    /// checks `query_starts` (from 0, non-decreasing, within
    /// `max_query_tokens`, no chunk longer than its context).
    pub fn attend<Q: Element, O: Element>(
        &mut self,
        args: &AttendArgs<'_, Q>,
        out: &mut [O],
        lse: Option<&mut [f32]>,
    ) -> Result<()> {
        self.cache.require_host("attend")?;
        let bad = |m: String| Err(Error::invalid_argument(m));
        if Q::DTYPE != self.config.q_dtype {
            return bad(format!(
                "q: elements are {:?}, the decoder was created with q_dtype {:?}",
                Q::DTYPE,
                self.config.q_dtype
            ));
        }
        if O::DTYPE != self.config.out_dtype {
            return bad(format!(
                "out: elements are {:?}, the decoder was created with out_dtype {:?}",
                O::DTYPE,
                self.config.out_dtype
            ));
        }
        let info = self.cache.info();
        let n = args.seq_lens.len();
        let num_seqs =
            i32::try_from(n).map_err(|_| Error::invalid_argument("seq_lens is too long".into()))?;
        if args.block_table_width < 1 {
            return bad(format!(
                "block_table_width = {}, must be >= 1",
                args.block_table_width
            ));
        }
        let heads = self.config.num_query_heads.max(0) as usize;
        let dense = heads * info.head_size as usize;
        let q_stride = if args.q_token_stride == 0 {
            dense
        } else {
            args.q_token_stride
        };
        let width = args.block_table_width as usize;
        let t_stride = if args.block_table_stride == 0 {
            width
        } else {
            args.block_table_stride
        };
        if q_stride < dense {
            return bad(format!(
                "q_token_stride = {}, must be 0 or >= num_query_heads * head_size = {}",
                q_stride, dense
            ));
        }
        if t_stride < width {
            return bad(format!(
                "block_table_stride = {}, must be 0 or >= block_table_width = {}",
                t_stride, width
            ));
        }
        if n > 0 {
            if args.query_starts.len() < n + 1 {
                return bad(format!(
                    "query_starts has {} elements, needs num_seqs + 1 = {}",
                    args.query_starts.len(),
                    n + 1
                ));
            }
            let need = (n - 1) * t_stride + width;
            if args.block_table.len() < need {
                return bad(format!(
                    "block_table has {} elements, needs {} for {} sequences",
                    args.block_table.len(),
                    need,
                    n
                ));
            }
        }
        // A negative total is left to the library, which names it.
        let rows = if n > 0 {
            args.query_starts[n].max(0) as usize
        } else {
            0
        };
        if rows > 0 {
            let checks = [
                ("q", args.q.len(), (rows - 1) * q_stride + dense),
                ("out", out.len(), rows * dense),
            ];
            for (name, have, need) in checks {
                if have < need {
                    return bad(format!(
                        "{} has {} elements, needs {} for query_starts[{}] = {} query tokens",
                        name, have, need, n, rows
                    ));
                }
            }
            if let Some(l) = &lse {
                if l.len() < rows * heads {
                    return bad(format!(
                        "lse has {} elements, needs {}",
                        l.len(),
                        rows * heads
                    ));
                }
            }
        }
        if let Some(a) = args.alibi_slopes {
            if a.len() < heads {
                return bad(format!(
                    "alibi_slopes has {} values, needs num_query_heads = {}",
                    a.len(),
                    heads
                ));
            }
        }
        let raw = RawAttendArgs {
            layer: args.layer,
            num_seqs,
            sliding_window: args.sliding_window,
            sm_scale: args.sm_scale,
            logits_soft_cap: args.logits_soft_cap,
            query_starts: args.query_starts.as_ptr(),
            q: args.q.as_ptr() as *const c_void,
            q_token_stride: q_stride as i64,
            block_table: args.block_table.as_ptr(),
            block_table_stride: t_stride as i64,
            block_table_width: args.block_table_width,
            seq_lens: args.seq_lens.as_ptr(),
            alibi_slopes: args.alibi_slopes.map_or(ptr::null(), |a| a.as_ptr()),
            out: out.as_mut_ptr() as *mut c_void,
            out_token_stride: 0,
            lse: lse.map_or(ptr::null_mut(), |l| l.as_mut_ptr()),
        };
        // SAFETY: host cache; the buffers cover query_starts[num_seqs] tokens
        // and num_seqs table rows (checked above); the CPU backend checks
        // query_starts (from 0, non-decreasing, within max_query_tokens, so
        // never past query_starts[num_seqs]) and every length and block id
        // on the host before it reads or writes anything.
        unsafe { self.attend_raw(&raw, Stream::DEFAULT) }
    }

    /// `kvp_attend` with raw pointers, for CUDA caches and device memory:
    /// launches on `stream` without allocating or synchronizing.
    ///
    /// # Safety
    /// Every pointer must be in the cache's memory space and cover what the
    /// header's definition reads or writes for these sizes until the call
    /// has run; `query_starts` must start at 0, not decrease and stay within
    /// `max_query_tokens`, the block ids below `num_blocks` and the lengths
    /// within `max_context_len` and the table (the CUDA backend checks
    /// values in device memory only in checked mode).
    pub unsafe fn attend_raw(&mut self, args: &RawAttendArgs, stream: Stream) -> Result<()> {
        let mut a = MaybeUninit::<sys::kvp_attend_args>::zeroed();
        sys::kvp_attend_args_init(a.as_mut_ptr());
        let mut a = a.assume_init();
        a.layer = args.layer;
        a.num_seqs = args.num_seqs;
        a.sliding_window = args.sliding_window;
        a.sm_scale = args.sm_scale;
        a.logits_soft_cap = args.logits_soft_cap;
        a.query_starts = args.query_starts;
        a.q = args.q;
        a.q_token_stride = args.q_token_stride;
        a.block_table = args.block_table;
        a.block_table_stride = args.block_table_stride;
        a.block_table_width = args.block_table_width;
        a.seq_lens = args.seq_lens;
        a.alibi_slopes = args.alibi_slopes;
        a.out = args.out;
        a.out_token_stride = args.out_token_stride;
        a.lse = args.lse;
        check(sys::kvp_attend(self.raw.as_ptr(), &a, stream.as_raw()))
    }
}
