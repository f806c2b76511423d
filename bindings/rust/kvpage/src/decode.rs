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

/// A header struct as its `kvp_*_init` function fills it.
fn c_init<T>(init: unsafe extern "C" fn(*mut T)) -> T {
    let mut c = MaybeUninit::<T>::zeroed();
    // SAFETY: the header's init functions fill the struct they are given;
    // all zeros is a valid value of every header struct besides.
    unsafe {
        init(c.as_mut_ptr());
        c.assume_init()
    }
}

fn raw_decode_config() -> sys::kvp_decode_config {
    c_init(sys::kvp_decode_config_init)
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

/// A `$ty` literal: the shared fields from `$src` (any struct that has
/// them), then `$rest` (the type's own fields, and `..base`).
macro_rules! with_shared {
    ($ty:path, $src:expr, { $($rest:tt)* }) => {{
        let s = $src;
        $ty {
            layer: s.layer,
            num_seqs: s.num_seqs,
            sliding_window: s.sliding_window,
            sm_scale: s.sm_scale,
            logits_soft_cap: s.logits_soft_cap,
            q: s.q,
            q_token_stride: s.q_token_stride,
            block_table: s.block_table,
            block_table_stride: s.block_table_stride,
            block_table_width: s.block_table_width,
            seq_lens: s.seq_lens,
            alibi_slopes: s.alibi_slopes,
            out: s.out,
            out_token_stride: s.out_token_stride,
            lse: s.lse,
            $($rest)*
        }
    }};
}

/// A `$ty` literal from a host call's [`DecodeArgs`] or [`AttendArgs`]:
/// the shared fields, strides resolved by `$l` (a `Layout`), then `$rest`.
macro_rules! from_host {
    ($ty:path, $args:expr, $num_seqs:expr, $l:expr, $out:expr, $lse:expr, { $($rest:tt)* }) => {{
        let a = $args;
        $ty {
            layer: a.layer,
            num_seqs: $num_seqs,
            sliding_window: a.sliding_window,
            sm_scale: a.sm_scale,
            logits_soft_cap: a.logits_soft_cap,
            q: a.q.as_ptr() as *const c_void,
            q_token_stride: $l.q_stride as i64,
            block_table: a.block_table.as_ptr(),
            block_table_stride: $l.t_stride as i64,
            block_table_width: a.block_table_width,
            seq_lens: a.seq_lens.as_ptr(),
            alibi_slopes: a.alibi_slopes.map_or(ptr::null(), |x| x.as_ptr()),
            out: $out.as_mut_ptr() as *mut c_void,
            out_token_stride: 0,
            lse: $lse.map_or(ptr::null_mut(), |x| x.as_mut_ptr()),
            $($rest)*
        }
    }};
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
        with_shared!(RawAttendArgs, RawDecodeArgs::default(), {
            query_starts: ptr::null(),
        })
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
        let num_seqs = self.host_call::<Q, O>("decode", args.seq_lens)?;
        if args.query_len < 1 {
            return bad(format!("query_len = {}, must be >= 1", args.query_len));
        }
        let l = self.layout(
            args.q_token_stride,
            args.block_table_width,
            args.block_table_stride,
        )?;
        let n = args.seq_lens.len();
        let rows = n * args.query_len as usize;
        if rows > 0 {
            let [q, o] = l.token_sizes(rows, args.q.len(), out.len());
            let table = ("block_table", args.block_table.len(), l.table_need(n));
            check_sizes(&[q, o, table], || {
                format!(
                    "for {} sequences x {} query tokens",
                    num_seqs, args.query_len
                )
            })?;
        }
        l.check_lse_alibi(rows, lse.as_deref(), args.alibi_slopes)?;
        let raw = from_host!(RawDecodeArgs, args, num_seqs, l, out, lse, {
            query_len: args.query_len,
        });
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
        let a = with_shared!(sys::kvp_decode_args, *args, {
            query_len: args.query_len,
            ..c_init(sys::kvp_decode_args_init)
        });
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
        let num_seqs = self.host_call::<Q, O>("attend", args.seq_lens)?;
        let l = self.layout(
            args.q_token_stride,
            args.block_table_width,
            args.block_table_stride,
        )?;
        let n = args.seq_lens.len();
        if n > 0 {
            if args.query_starts.len() < n + 1 {
                return bad(format!(
                    "query_starts has {} elements, needs num_seqs + 1 = {}",
                    args.query_starts.len(),
                    n + 1
                ));
            }
            let table = ("block_table", args.block_table.len(), l.table_need(n));
            check_sizes(&[table], || format!("for {} sequences", n))?;
        }
        // A negative total is left to the library, which names it.
        let rows = if n > 0 {
            args.query_starts[n].max(0) as usize
        } else {
            0
        };
        if rows > 0 {
            check_sizes(&l.token_sizes(rows, args.q.len(), out.len()), || {
                format!("for query_starts[{}] = {} query tokens", n, rows)
            })?;
        }
        l.check_lse_alibi(rows, lse.as_deref(), args.alibi_slopes)?;
        let raw = from_host!(RawAttendArgs, args, num_seqs, l, out, lse, {
            query_starts: args.query_starts.as_ptr(),
        });
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
        let a = with_shared!(sys::kvp_attend_args, *args, {
            query_starts: args.query_starts,
            ..c_init(sys::kvp_attend_args_init)
        });
        check(sys::kvp_attend(self.raw.as_ptr(), &a, stream.as_raw()))
    }

    /// The checks every host call starts with: a CPU cache, and `Q` and `O`
    /// the decoder's types. Returns the number of sequences.
    fn host_call<Q: Element, O: Element>(&self, what: &str, seq_lens: &[i32]) -> Result<i32> {
        self.cache.require_host(what)?;
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
        i32::try_from(seq_lens.len())
            .map_err(|_| Error::invalid_argument("seq_lens is too long".into()))
    }

    /// Resolves and checks a host call's strides (0 = dense).
    fn layout(
        &self,
        q_token_stride: usize,
        block_table_width: i32,
        block_table_stride: usize,
    ) -> Result<Layout> {
        if block_table_width < 1 {
            return bad(format!(
                "block_table_width = {}, must be >= 1",
                block_table_width
            ));
        }
        let heads = self.config.num_query_heads.max(0) as usize;
        let dense = heads * self.cache.info().head_size as usize;
        let width = block_table_width as usize;
        let l = Layout {
            heads,
            dense,
            q_stride: if q_token_stride == 0 {
                dense
            } else {
                q_token_stride
            },
            width,
            t_stride: if block_table_stride == 0 {
                width
            } else {
                block_table_stride
            },
        };
        if l.q_stride < dense {
            return bad(format!(
                "q_token_stride = {}, must be 0 or >= num_query_heads * head_size = {}",
                l.q_stride, dense
            ));
        }
        if l.t_stride < width {
            return bad(format!(
                "block_table_stride = {}, must be 0 or >= block_table_width = {}",
                l.t_stride, width
            ));
        }
        Ok(l)
    }
}

fn bad<T>(message: String) -> Result<T> {
    Err(Error::invalid_argument(message))
}

/// `(name, elements given, elements needed)` of one buffer.
type Size = (&'static str, usize, usize);

/// Fails on the first buffer of `sizes` shorter than it needs; `what` ends
/// the message.
fn check_sizes(sizes: &[Size], what: impl Fn() -> String) -> Result<()> {
    for &(name, have, need) in sizes {
        if have < need {
            return bad(format!(
                "{} has {} elements, needs {} {}",
                name,
                have,
                need,
                what()
            ));
        }
    }
    Ok(())
}

/// The strides of a host call, resolved.
struct Layout {
    heads: usize,
    /// `num_query_heads * head_size`.
    dense: usize,
    q_stride: usize,
    width: usize,
    t_stride: usize,
}

impl Layout {
    /// The sizes of `q` and `out` for `rows` query tokens.
    fn token_sizes(&self, rows: usize, q: usize, out: usize) -> [Size; 2] {
        [
            ("q", q, (rows - 1) * self.q_stride + self.dense),
            ("out", out, rows * self.dense),
        ]
    }

    /// Elements a block table of `n` rows needs.
    fn table_need(&self, n: usize) -> usize {
        (n - 1) * self.t_stride + self.width
    }

    /// Checks `lse` for `rows` query tokens and `alibi_slopes`.
    fn check_lse_alibi(
        &self,
        rows: usize,
        lse: Option<&[f32]>,
        alibi: Option<&[f32]>,
    ) -> Result<()> {
        if let Some(l) = lse {
            if rows > 0 && l.len() < rows * self.heads {
                return bad(format!(
                    "lse has {} elements, needs {}",
                    l.len(),
                    rows * self.heads
                ));
            }
        }
        if let Some(a) = alibi {
            if a.len() < self.heads {
                return bad(format!(
                    "alibi_slopes has {} values, needs num_query_heads = {}",
                    a.len(),
                    self.heads
                ));
            }
        }
        Ok(())
    }
}
