// SPDX-License-Identifier: Apache-2.0

package kvpage

/*
#include "kvpage_go.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// FormatSignatureBytes is the size of a format signature
// (KVP_FORMAT_SIGNATURE_BYTES).
const FormatSignatureBytes = int(C.KVP_FORMAT_SIGNATURE_BYTES)

// PackOptions is what [Cache.Pack] and [Cache.Unpack] move besides the
// block ids: layers FirstLayer.. (NumLayers of them, 0 = through the last),
// after checking a peer's Signature (its [Cache.FormatSignature]) when one
// is given.
type PackOptions struct {
	FirstLayer, NumLayers int
	Signature             []byte
}

// RawPackArgs is [Cache.PackRaw]'s and [Cache.UnpackRaw]'s arguments
// (kvp_pack_args): addresses in the cache's memory space, device pointers
// for a CUDA cache; Signature is a peer's signature or nil.
type RawPackArgs struct {
	BlockIDs              uintptr // int32 [NumBlocks]
	NumBlocks             int
	FirstLayer, NumLayers int
	Buffer                uintptr
	BufferBytes           uint64
	Signature             []byte
}

// NewPackBuffer returns n bytes of host memory at a 16-byte aligned
// address, as packed buffers need (Go's allocator does not promise it).
func NewPackBuffer(n int) []byte {
	b := make([]byte, n+16)
	off := int((16 - uintptr(unsafe.Pointer(&b[0]))%16) % 16)
	return b[off : off+n : off+n]
}

// PackSize is the bytes of a buffer of numBlocks blocks of numLayers layers
// (0 = every layer): kvp_cache_pack_size.
func (c *Cache) PackSize(numBlocks, numLayers int) (uint64, error) {
	n, err := toInt32(numBlocks, "numBlocks")
	if err != nil {
		return 0, err
	}
	l, err := toInt32(numLayers, "numLayers")
	if err != nil {
		return 0, err
	}
	ptr, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	var bytes C.uint64_t
	err = takeError(C.kvp_cache_pack_size(ptr, n, l, &bytes))
	runtime.KeepAlive(c)
	return uint64(bytes), err
}

// FormatSignature is the cache's format signature: what a peer checks
// before it unpacks this cache's blocks (kvp_cache_format_signature).
func (c *Cache) FormatSignature() ([]byte, error) {
	ptr, err := c.acquire()
	if err != nil {
		return nil, err
	}
	defer c.mu.RUnlock()
	s := make([]byte, FormatSignatureBytes)
	err = takeError(C.kvp_cache_format_signature(ptr, unsafe.Pointer(&s[0]), C.size_t(len(s))))
	runtime.KeepAlive(c)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// CheckSignature fails with CodeInvalidArgument, naming the first field that
// differs and both values, unless signature (a peer's FormatSignature) is
// this cache's format (kvp_cache_check_signature).
func (c *Cache) CheckSignature(signature []byte) error {
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var p unsafe.Pointer
	if len(signature) > 0 {
		p = unsafe.Pointer(&signature[0])
	}
	err = takeError(C.kvp_cache_check_signature(ptr, p, C.size_t(len(signature))))
	runtime.KeepAlive(c)
	runtime.KeepAlive(signature)
	return err
}

// Pack copies blocks blockIDs (in buffer order; they may repeat) of a CPU
// cache into buf (16-byte aligned, e.g. from [NewPackBuffer], of at least
// [Cache.PackSize] bytes): kvp_cache_pack, layout in docs/FORMATS.md
// ("Packed blocks").
func (c *Cache) Pack(blockIDs []int32, buf []byte, o PackOptions) error {
	return c.packHost("Pack", 0, blockIDs, buf, o)
}

// Unpack copies buf, packed by a cache of the same format, into blocks
// blockIDs (distinct) of a CPU cache: kvp_cache_unpack.
func (c *Cache) Unpack(blockIDs []int32, buf []byte, o PackOptions) error {
	return c.packHost("Unpack", 1, blockIDs, buf, o)
}

func (c *Cache) packHost(what string, unpack C.int32_t, blockIDs []int32, buf []byte, o PackOptions) error {
	if err := c.requireHost(what); err != nil {
		return err
	}
	n, first, layers, sig, err := packFields(len(blockIDs), o.FirstLayer, o.NumLayers, o.Signature)
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var ids *C.int32_t
	if len(blockIDs) > 0 {
		ids = (*C.int32_t)(unsafe.Pointer(&blockIDs[0]))
	}
	var b unsafe.Pointer
	if len(buf) > 0 {
		b = unsafe.Pointer(&buf[0])
	}
	// Go memory goes in as pointers in the call itself (cgo keeps it in place).
	err = takeError(C.kvpgo_pack(ptr, unpack, ids, n, first, layers, b, C.uint64_t(len(buf)), sig, 0))
	runtime.KeepAlive(c)
	runtime.KeepAlive(blockIDs)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(o.Signature)
	return err
}

// PackRaw is kvp_cache_pack with addresses in the cache's memory space (a
// CUDA cache's device memory): it launches on stream without allocating or
// synchronizing. The caller answers for the addresses: NumBlocks ids below
// the cache's NumBlocks and BufferBytes bytes, until the pack has run.
func (c *Cache) PackRaw(a RawPackArgs, stream uintptr) error { return c.packRaw(0, a, stream) }

// UnpackRaw is kvp_cache_unpack with addresses in the cache's memory space;
// the destinations must be distinct.
func (c *Cache) UnpackRaw(a RawPackArgs, stream uintptr) error { return c.packRaw(1, a, stream) }

func (c *Cache) packRaw(unpack C.int32_t, a RawPackArgs, stream uintptr) error {
	n, first, layers, sig, err := packFields(a.NumBlocks, a.FirstLayer, a.NumLayers, a.Signature)
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	err = takeError(C.kvpgo_pack_raw(ptr, unpack, C.uintptr_t(a.BlockIDs), n, first, layers,
		C.uintptr_t(a.Buffer), C.uint64_t(a.BufferBytes), sig, C.uintptr_t(stream)))
	runtime.KeepAlive(c)
	runtime.KeepAlive(a.Signature)
	return err
}

// packFields is a pack's counts as int32 and its peer signature's address
// (nil for none; the library reads FormatSignatureBytes bytes there).
func packFields(numBlocks, firstLayer, numLayers int, signature []byte) (n, first, layers C.int32_t,
	sig unsafe.Pointer, err error) {
	if n, err = toInt32(numBlocks, "NumBlocks"); err != nil {
		return
	}
	if first, err = toInt32(firstLayer, "FirstLayer"); err != nil {
		return
	}
	if layers, err = toInt32(numLayers, "NumLayers"); err != nil {
		return
	}
	if signature != nil {
		if len(signature) != FormatSignatureBytes {
			err = invalidArg("Signature has %d bytes, expected FormatSignatureBytes = %d", len(signature),
				FormatSignatureBytes)
			return
		}
		sig = unsafe.Pointer(&signature[0])
	}
	return
}
