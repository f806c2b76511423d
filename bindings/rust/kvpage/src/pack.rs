// SPDX-License-Identifier: Apache-2.0
//! Moving blocks to a cache in another process: pack and unpack
//! (`kvp_cache_pack`, `kvp_cache_unpack`, ABI 1.4) and the format signature
//! a receiver checks first.
use std::ffi::c_void;
use std::ptr;

use kvpage_sys as sys;

use crate::cache::{Cache, Stream};
use crate::error::{check, Error, Result};

/// A cache's format signature ([`Cache::format_signature`]): the bytes an
/// engine sends its peer once per connection.
pub type FormatSignature = [u8; sys::KVP_FORMAT_SIGNATURE_BYTES];

/// What [`Cache::pack`] and [`Cache::unpack`] move: blocks `block_ids` (in
/// buffer order; pack sources may repeat, unpack destinations are
/// distinct) of layers `first_layer..` (`num_layers` of them, 0 = through
/// the last), after checking a peer's `signature` when one is given.
#[derive(Debug, Clone, Copy)]
pub struct PackArgs<'a> {
    pub block_ids: &'a [i32],
    pub first_layer: i32,
    pub num_layers: i32,
    pub signature: Option<&'a FormatSignature>,
}

impl<'a> PackArgs<'a> {
    /// Every layer of `block_ids`, no signature check.
    pub fn new(block_ids: &'a [i32]) -> PackArgs<'a> {
        PackArgs {
            block_ids,
            first_layer: 0,
            num_layers: 0,
            signature: None,
        }
    }
}

/// [`Cache::pack_raw`]'s and [`Cache::unpack_raw`]'s arguments
/// (`kvp_pack_args`): addresses in the cache's memory space, device
/// pointers for a CUDA cache; `signature` is host memory or null.
#[derive(Debug, Clone, Copy)]
pub struct RawPackArgs {
    pub block_ids: *const i32,
    pub num_blocks: i32,
    pub first_layer: i32,
    pub num_layers: i32,
    pub buffer: *mut c_void,
    pub buffer_bytes: u64,
    pub signature: *const c_void,
}

impl Default for RawPackArgs {
    fn default() -> RawPackArgs {
        RawPackArgs {
            block_ids: ptr::null(),
            num_blocks: 0,
            first_layer: 0,
            num_layers: 0,
            buffer: ptr::null_mut(),
            buffer_bytes: 0,
            signature: ptr::null(),
        }
    }
}

/// Host bytes at a 16-byte aligned address, as packed buffers need.
#[derive(Debug, Clone)]
pub struct PackBuffer {
    words: Vec<u128>,
    len: usize,
}

impl PackBuffer {
    /// `len` zero bytes.
    pub fn new(len: usize) -> PackBuffer {
        PackBuffer {
            words: vec![0u128; (len + 15) / 16],
            len,
        }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the words hold at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

impl Cache {
    /// Bytes of a buffer of `num_blocks` blocks of `num_layers` layers (0 =
    /// every layer).
    pub fn pack_size(&self, num_blocks: usize, num_layers: i32) -> Result<u64> {
        let n = i32::try_from(num_blocks).map_err(|_| {
            Error::invalid_argument(format!("num_blocks = {} does not fit in int32", num_blocks))
        })?;
        let mut bytes = 0u64;
        // SAFETY: live handle, out-pointer.
        check(unsafe { sys::kvp_cache_pack_size(self.as_raw(), n, num_layers, &mut bytes) })?;
        Ok(bytes)
    }

    /// This cache's format signature.
    pub fn format_signature(&self) -> Result<FormatSignature> {
        let mut s = [0u8; sys::KVP_FORMAT_SIGNATURE_BYTES];
        // SAFETY: live handle; `s` holds KVP_FORMAT_SIGNATURE_BYTES bytes.
        check(unsafe {
            sys::kvp_cache_format_signature(self.as_raw(), s.as_mut_ptr() as *mut c_void, s.len())
        })?;
        Ok(s)
    }

    /// Fails with [`ErrorCode::InvalidArgument`](crate::ErrorCode), naming
    /// the first field that differs and both values, unless `signature` (a
    /// peer's [`Cache::format_signature`]) is this cache's format.
    pub fn check_signature(&self, signature: &[u8]) -> Result<()> {
        // SAFETY: live handle; the library reads at most signature.len() bytes.
        check(unsafe {
            sys::kvp_cache_check_signature(
                self.as_raw(),
                signature.as_ptr() as *const c_void,
                signature.len(),
            )
        })
    }

    /// Packs the blocks of a CPU cache into `buffer` (16-byte aligned, e.g.
    /// a [`PackBuffer`], of at least [`Cache::pack_size`] bytes).
    pub fn pack(&self, args: &PackArgs<'_>, buffer: &mut [u8]) -> Result<()> {
        self.require_host("pack")?;
        let raw = host_args(args, buffer.as_mut_ptr() as *mut c_void, buffer.len())?;
        // SAFETY: host cache; the ids and the buffer are host slices whose
        // lengths the library checks against what it moves.
        unsafe { self.pack_raw(&raw, Stream::DEFAULT) }
    }

    /// Unpacks `buffer` (packed by a cache of the same format) into the
    /// blocks of a CPU cache.
    pub fn unpack(&self, args: &PackArgs<'_>, buffer: &[u8]) -> Result<()> {
        self.require_host("unpack")?;
        let raw = host_args(args, buffer.as_ptr() as *mut c_void, buffer.len())?;
        // SAFETY: as for pack; the library only reads the buffer.
        unsafe { self.unpack_raw(&raw, Stream::DEFAULT) }
    }

    /// `kvp_cache_pack` with raw pointers, for CUDA caches and device
    /// memory: launches on `stream` without allocating or synchronizing.
    ///
    /// # Safety
    /// `block_ids` must hold `num_blocks` ids and `buffer` `buffer_bytes`
    /// bytes in the cache's memory space until the call has run; ids in
    /// device memory must be below `num_blocks` of the cache (the CUDA
    /// backend checks them only in checked mode); `signature` is null or
    /// [`sys::KVP_FORMAT_SIGNATURE_BYTES`] bytes of host memory.
    pub unsafe fn pack_raw(&self, args: &RawPackArgs, stream: Stream) -> Result<()> {
        let a = c_args(args);
        check(sys::kvp_cache_pack(self.as_raw(), &a, stream.as_raw()))
    }

    /// `kvp_cache_unpack` with raw pointers.
    ///
    /// # Safety
    /// As [`Cache::pack_raw`]; the destinations must also be distinct.
    pub unsafe fn unpack_raw(&self, args: &RawPackArgs, stream: Stream) -> Result<()> {
        let a = c_args(args);
        check(sys::kvp_cache_unpack(self.as_raw(), &a, stream.as_raw()))
    }
}

fn host_args(args: &PackArgs<'_>, buffer: *mut c_void, len: usize) -> Result<RawPackArgs> {
    Ok(RawPackArgs {
        block_ids: args.block_ids.as_ptr(),
        num_blocks: i32::try_from(args.block_ids.len()).map_err(|_| {
            Error::invalid_argument(format!(
                "block_ids.len() = {} does not fit in int32",
                args.block_ids.len()
            ))
        })?,
        first_layer: args.first_layer,
        num_layers: args.num_layers,
        buffer,
        buffer_bytes: len as u64,
        signature: args
            .signature
            .map_or(ptr::null(), |s| s.as_ptr() as *const c_void),
    })
}

fn c_args(args: &RawPackArgs) -> sys::kvp_pack_args {
    let mut a = std::mem::MaybeUninit::<sys::kvp_pack_args>::zeroed();
    // SAFETY: kvp_pack_args_init fills the whole struct.
    let mut a = unsafe {
        sys::kvp_pack_args_init(a.as_mut_ptr());
        a.assume_init()
    };
    a.block_ids = args.block_ids;
    a.num_blocks = args.num_blocks;
    a.first_layer = args.first_layer;
    a.num_layers = args.num_layers;
    a.buffer = args.buffer;
    a.buffer_bytes = args.buffer_bytes;
    a.signature = args.signature;
    a
}
