// SPDX-License-Identifier: Apache-2.0

package kvpage

/*
#include "kvpage_go.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// CacheConfig is the geometry, dtypes and device of a cache.
// [DefaultCacheConfig] gives the library's defaults; NumBlocks and
// NumKVHeads must be set.
type CacheConfig struct {
	Device        DeviceKind // default CPU
	DeviceOrdinal int        // CUDA device; default 0
	NumLayers     int        // >= 1; default 1
	NumBlocks     int        // >= 1; default 0 (must be set)
	BlockSize     int        // tokens per block: 8, 16 or 32; default 16
	NumKVHeads    int        // >= 1; default 0 (must be set)
	HeadSize      int        // 64, 80, 96, 112, 128 or 256; default 128
	KDType        DType      // FP16, BF16, FP8E4M3, INT8 or INT4; default BF16
	VDType        DType      // same set; default BF16
	// Optional per-channel key smoothing (SmoothAttention): NumKVHeads *
	// HeadSize positive finite values, [kv_head][channel]; copied at creation.
	KeySmoothing []float32
	// Checked mode (ABI 1.1; default off): the CUDA kernels validate block
	// ids, sequence lengths, slot mappings and device-side copy pairs, and
	// the next Write, Decode or block copy on the cache reports the first
	// bad value as a CodeInvalidArgument error instead of reading or
	// writing out of bounds. The CPU backend validates them in every mode.
	Checked bool
}

// DefaultCacheConfig is the library's default configuration
// (kvp_cache_config_init).
func DefaultCacheConfig() CacheConfig {
	var c C.kvp_cache_config
	C.kvp_cache_config_init(&c)
	return CacheConfig{
		Device:        DeviceKind(c.device_kind),
		DeviceOrdinal: int(c.device_ordinal),
		NumLayers:     int(c.num_layers),
		NumBlocks:     int(c.num_blocks),
		BlockSize:     int(c.block_size),
		NumKVHeads:    int(c.num_kv_heads),
		HeadSize:      int(c.head_size),
		KDType:        DType(c.k_dtype),
		VDType:        DType(c.v_dtype),
		Checked:       c.checked != 0,
	}
}

// CacheInfo is the sizes of a cache as a whole.
type CacheInfo struct {
	Device          DeviceKind
	DeviceOrdinal   int
	NumLayers       int
	NumBlocks       int
	BlockSize       int
	NumKVHeads      int
	HeadSize        int
	KDType          DType
	VDType          DType
	HasKeySmoothing bool
	// Bytes one token occupies in one layer: K + V + scales, all KV heads.
	BytesPerTokenPerLayer int64
	TotalBytes            int64 // everything the cache allocated
}

// LayerLayout is where one layer of the cache lives (kvp_layer_layout; the
// addressing formulas are in the C header), for engines that read or write
// it themselves. Pointers are addresses in the cache's memory space, valid
// while the cache is open; strides are in bytes; scale pointers are 0 for
// FP16/BF16.
type LayerLayout struct {
	KData, VData, KScales, VScales                   uintptr
	KBlockStride, KHeadStride, KChunkStride          int64
	KX, KChunks                                      int32
	VBlockStride, VHeadStride, VChannelStride        int64
	KBits, VBits                                     int32
	KScaleBlockStride, KScaleHeadStride              int64
	VScaleBlockStride, VScaleHeadStride              int64
	KScaleEntryBytes, VScaleEntryBytes               int32
	KDataBytes, VDataBytes, KScaleBytes, VScaleBytes int64
}

// WriteStats is what the writes counted over all layers since creation or
// the last reset.
type WriteStats struct {
	NonFinite uint64 // NaN / ±Inf input values (stored as 0)
	Saturated uint64 // finite values clipped to the format's range
}

// SeqID is the id of a sequence, assigned by the cache (from 1, never
// reused: a stale id is an error, never another sequence).
type SeqID int64

// BlockTable is a dense block table for a batch: row i (Width entries)
// holds the blocks of the i-th sequence; entries past its blocks are 0.
type BlockTable struct {
	Table   []int32 // [num_seqs][Width], row-major
	Width   int
	SeqLens []int32
}

// WriteArgs is what [Cache.Write] writes: len(SlotMapping) tokens of K and
// V from host memory, Key[t*KeyTokenStride + h*HeadSize + d] (same for
// Value), token t going to slot SlotMapping[t] (-1 skips it). Key and Value
// are slices of one element type: []float32, []Float16 or []BFloat16.
type WriteArgs struct {
	Layer       int
	Key, Value  any
	SlotMapping []int64 // block*BlockSize + offset, or -1 (padding)
	// Elements between tokens; 0 = NumKVHeads*HeadSize (dense).
	KeyTokenStride, ValueTokenStride int
}

// RawWriteArgs is [Cache.WriteRaw]'s arguments (kvp_write_args): addresses
// in the cache's memory space, device pointers for a CUDA cache.
type RawWriteArgs struct {
	Layer, NumTokens                 int
	InputDType                       DType
	Key, Value                       uintptr
	KeyTokenStride, ValueTokenStride int64
	SlotMapping                      uintptr
}

// Cache is a paged KV cache: NumLayers layers sharing one block table, its
// sequences and their blocks. All methods are safe for concurrent use.
// Close releases it; it refuses while decoders of the cache are open.
type Cache struct {
	// mu is held shared by every call and exclusively by Close, so that
	// Close never races with a call (kvp_cache_destroy must not).
	mu       sync.RWMutex
	ptr      *C.kvp_cache
	info     CacheInfo
	decoders int32 // open decoders (atomic)
}

// finalizedCaches counts runs of the cache finalizer (for tests).
var finalizedCaches int64

// NewCache creates a cache (kvp_cache_create). Its memory is zeroed, so a
// slot never written decodes to 0.
func NewCache(cfg CacheConfig) (*Cache, error) {
	var checked int32
	if cfg.Checked {
		checked = 1
	}
	return newCache(cfg, checked)
}

// newCache is NewCache with kvp_cache_config.checked as the C API takes it
// (the tests pass a value the library refuses, to see it arrive).
func newCache(cfg CacheConfig, checked int32) (*Cache, error) {
	var ints [8]C.int32_t
	for i, v := range []struct {
		n    int
		name string
	}{
		{int(cfg.Device), "Device"}, {cfg.DeviceOrdinal, "DeviceOrdinal"},
		{cfg.NumLayers, "NumLayers"}, {cfg.NumBlocks, "NumBlocks"}, {cfg.BlockSize, "BlockSize"},
		{cfg.NumKVHeads, "NumKVHeads"}, {cfg.HeadSize, "HeadSize"}, {0, ""},
	} {
		x, err := toInt32(v.n, "cfg."+v.name)
		if err != nil {
			return nil, err
		}
		ints[i] = x
	}
	var smoothing *C.float
	if cfg.KeySmoothing != nil {
		// The library reads NumKVHeads*HeadSize values.
		if need := cfg.NumKVHeads * cfg.HeadSize; len(cfg.KeySmoothing) != need || need == 0 {
			return nil, invalidArg("cfg.KeySmoothing has %d values, must have NumKVHeads * HeadSize = %d",
				len(cfg.KeySmoothing), need)
		}
		smoothing = (*C.float)(unsafe.Pointer(&cfg.KeySmoothing[0]))
	}
	var ptr *C.kvp_cache
	err := takeError(C.kvpgo_cache_create(ints[0], ints[1], ints[2], ints[3], ints[4], ints[5], ints[6],
		C.int32_t(cfg.KDType), C.int32_t(cfg.VDType), smoothing, C.int32_t(checked), &ptr))
	runtime.KeepAlive(cfg.KeySmoothing)
	if err != nil {
		return nil, err
	}
	c := &Cache{ptr: ptr}
	runtime.SetFinalizer(c, (*Cache).finalize)
	var i C.kvp_cache_info
	C.kvp_cache_info_init(&i)
	if err := takeError(C.kvp_cache_get_info(ptr, &i)); err != nil {
		c.Close()
		return nil, err
	}
	c.info = CacheInfo{
		Device: DeviceKind(i.device_kind), DeviceOrdinal: int(i.device_ordinal),
		NumLayers: int(i.num_layers), NumBlocks: int(i.num_blocks), BlockSize: int(i.block_size),
		NumKVHeads: int(i.num_kv_heads), HeadSize: int(i.head_size),
		KDType: DType(i.k_dtype), VDType: DType(i.v_dtype), HasKeySmoothing: i.has_key_smoothing != 0,
		BytesPerTokenPerLayer: int64(i.bytes_per_token_per_layer), TotalBytes: int64(i.total_bytes),
	}
	return c, nil
}

func (c *Cache) finalize() {
	// Unreachable, so nothing else can use it; its decoders, which keep it
	// reachable, were finalized first.
	atomic.AddInt64(&finalizedCaches, 1)
	if c.ptr != nil {
		C.kvp_cache_destroy(c.ptr)
		c.ptr = nil
	}
}

// Close releases the cache. It returns an error, and releases nothing,
// while decoders of the cache are open. Closing twice is a no-op.
func (c *Cache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr == nil {
		return nil
	}
	if n := atomic.LoadInt32(&c.decoders); n > 0 {
		return invalidArg("cache: %d decoders still open; close them before the cache", n)
	}
	C.kvp_cache_destroy(c.ptr)
	c.ptr = nil
	runtime.SetFinalizer(c, nil)
	return nil
}

// acquire takes the shared lock and returns the live handle; release with
// c.mu.RUnlock().
func (c *Cache) acquire() (*C.kvp_cache, error) {
	c.mu.RLock()
	if c.ptr == nil {
		c.mu.RUnlock()
		return nil, invalidArg("cache is closed")
	}
	return c.ptr, nil
}

// Info is the cache's sizes (kvp_cache_get_info, read at creation).
func (c *Cache) Info() CacheInfo { return c.info }

func (c *Cache) requireHost(what string) error {
	if c.info.Device != CPU {
		return invalidArg("%s: Go slices need a CPU cache, this one is on %v (use the Raw call with device pointers)",
			what, c.info.Device)
	}
	return nil
}

// Layout is where layer `layer` lives (kvp_cache_get_layout).
func (c *Cache) Layout(layer int) (LayerLayout, error) {
	ptr, err := c.acquire()
	if err != nil {
		return LayerLayout{}, err
	}
	defer c.mu.RUnlock()
	l32, err := toInt32(layer, "layer")
	if err != nil {
		return LayerLayout{}, err
	}
	var l C.kvp_layer_layout
	C.kvp_layer_layout_init(&l)
	err = takeError(C.kvp_cache_get_layout(ptr, l32, &l))
	runtime.KeepAlive(c)
	if err != nil {
		return LayerLayout{}, err
	}
	return LayerLayout{
		KData: uintptr(l.k_data), VData: uintptr(l.v_data),
		KScales: uintptr(l.k_scales), VScales: uintptr(l.v_scales),
		KBlockStride: int64(l.k_block_stride), KHeadStride: int64(l.k_head_stride),
		KChunkStride: int64(l.k_chunk_stride), KX: int32(l.k_x), KChunks: int32(l.k_chunks),
		VBlockStride: int64(l.v_block_stride), VHeadStride: int64(l.v_head_stride),
		VChannelStride: int64(l.v_channel_stride), KBits: int32(l.k_bits), VBits: int32(l.v_bits),
		KScaleBlockStride: int64(l.k_scale_block_stride), KScaleHeadStride: int64(l.k_scale_head_stride),
		VScaleBlockStride: int64(l.v_scale_block_stride), VScaleHeadStride: int64(l.v_scale_head_stride),
		KScaleEntryBytes: int32(l.k_scale_entry_bytes), VScaleEntryBytes: int32(l.v_scale_entry_bytes),
		KDataBytes: int64(l.k_data_bytes), VDataBytes: int64(l.v_data_bytes),
		KScaleBytes: int64(l.k_scale_bytes), VScaleBytes: int64(l.v_scale_bytes),
	}, nil
}

// readHost copies n bytes of host memory at addr, e.g. a region of a CPU
// cache's LayerLayout (used by the tests to read the cache as stored).
func readHost(addr uintptr, n int64) []byte {
	b := make([]byte, n)
	if n > 0 {
		C.kvpgo_read_host(unsafe.Pointer(&b[0]), C.uintptr_t(addr), C.size_t(n))
	}
	return b
}

// ---- Sequences --------------------------------------------------------------

// CreateSeq creates an empty sequence.
func (c *Cache) CreateSeq() (SeqID, error) {
	ptr, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	var id C.int64_t
	err = takeError(C.kvp_seq_create(ptr, &id))
	runtime.KeepAlive(c)
	return SeqID(id), err
}

// ForkSeq creates a sequence sharing every block of parent (prefix
// sharing); the first append to a shared, partly filled block copies it.
func (c *Cache) ForkSeq(parent SeqID) (SeqID, error) {
	ptr, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	var id C.int64_t
	err = takeError(C.kvp_seq_fork(ptr, C.int64_t(parent), &id))
	runtime.KeepAlive(c)
	return SeqID(id), err
}

// Append appends numTokens tokens to seq, allocating blocks as needed, and
// returns their slots (block*BlockSize + offset). Too few free blocks:
// [CodeOutOfBlocks], and nothing changes.
func (c *Cache) Append(seq SeqID, numTokens int) ([]int64, error) {
	if numTokens < 0 {
		return nil, invalidArg("numTokens = %d, must be >= 0", numTokens)
	}
	slots := make([]int64, numTokens)
	if err := c.AppendTo(seq, slots, 0); err != nil {
		return nil, err
	}
	return slots, nil
}

// AppendTo appends len(slots) tokens and writes their slots into slots; a
// copy-on-write runs on stream (a cudaStream_t, 0 = default; ignored on
// the CPU) before the call returns.
func (c *Cache) AppendTo(seq SeqID, slots []int64, stream uintptr) error {
	n, err := toInt32(len(slots), "len(slots)")
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var p *C.int64_t
	if n > 0 {
		p = (*C.int64_t)(unsafe.Pointer(&slots[0]))
	}
	err = takeError(C.kvpgo_seq_append(ptr, C.int64_t(seq), n, p, C.uintptr_t(stream)))
	runtime.KeepAlive(c)
	runtime.KeepAlive(slots)
	return err
}

// Truncate shortens seq to length tokens, releasing blocks it no longer
// needs (rejected speculative tokens).
func (c *Cache) Truncate(seq SeqID, length int) error {
	l32, err := toInt32(length, "length")
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	err = takeError(C.kvp_seq_truncate(ptr, C.int64_t(seq), l32))
	runtime.KeepAlive(c)
	return err
}

// FreeSeq releases seq and its references to blocks.
func (c *Cache) FreeSeq(seq SeqID) error {
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	err = takeError(C.kvp_seq_free(ptr, C.int64_t(seq)))
	runtime.KeepAlive(c)
	return err
}

// SeqLen is the length of seq in tokens.
func (c *Cache) SeqLen(seq SeqID) (int, error) {
	ptr, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	var n C.int32_t
	err = takeError(C.kvp_seq_length(ptr, C.int64_t(seq), &n))
	runtime.KeepAlive(c)
	return int(n), err
}

// NumFreeBlocks is the number of blocks no sequence holds.
func (c *Cache) NumFreeBlocks() (int, error) {
	ptr, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	var n C.int32_t
	err = takeError(C.kvp_cache_num_free_blocks(ptr, &n))
	runtime.KeepAlive(c)
	return int(n), err
}

// BlockTable is the dense block table of a batch, width blocks per row.
func (c *Cache) BlockTable(seqs []SeqID, width int) (*BlockTable, error) {
	if width < 1 {
		return nil, invalidArg("width = %d, must be >= 1", width)
	}
	t := &BlockTable{Table: make([]int32, len(seqs)*width), Width: width, SeqLens: make([]int32, len(seqs))}
	if err := c.ExportBlockTable(seqs, width, width, t.Table, t.SeqLens); err != nil {
		return nil, err
	}
	return t, nil
}

// ExportBlockTable writes a batch's block table into table
// (table[i*rowStride + j], j < maxBlocksPerSeq) and, unless nil, the
// lengths into seqLens (kvp_cache_export_block_table).
func (c *Cache) ExportBlockTable(seqs []SeqID, maxBlocksPerSeq, rowStride int, table, seqLens []int32) error {
	n, err := toInt32(len(seqs), "len(seqs)")
	if err != nil {
		return err
	}
	mb, err := toInt32(maxBlocksPerSeq, "maxBlocksPerSeq")
	if err != nil {
		return err
	}
	if n > 0 && mb >= 1 && rowStride >= maxBlocksPerSeq {
		if need := (len(seqs)-1)*rowStride + maxBlocksPerSeq; len(table) < need {
			return invalidArg("table has %d entries, needs (len(seqs) - 1) * rowStride + maxBlocksPerSeq = %d",
				len(table), need)
		}
	}
	if seqLens != nil && len(seqLens) < len(seqs) {
		return invalidArg("seqLens has %d entries, needs len(seqs) = %d", len(seqLens), len(seqs))
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var ids *C.int64_t
	var tp, lp *C.int32_t
	if n > 0 {
		ids = (*C.int64_t)(unsafe.Pointer(&seqs[0]))
		if len(table) > 0 {
			tp = (*C.int32_t)(unsafe.Pointer(&table[0]))
		}
		if seqLens != nil {
			lp = (*C.int32_t)(unsafe.Pointer(&seqLens[0]))
		}
	}
	err = takeError(C.kvp_cache_export_block_table(ptr, ids, n, mb, C.int64_t(rowStride), tp, lp))
	runtime.KeepAlive(c)
	runtime.KeepAlive(seqs)
	runtime.KeepAlive(table)
	runtime.KeepAlive(seqLens)
	return err
}

// ---- Writes -------------------------------------------------------------------

// Write writes (quantizing) K and V of Go memory into a CPU cache.
// Non-finite inputs are stored as 0 and counted; values beyond the format's
// range saturate and are counted ([Cache.WriteStats]).
func (c *Cache) Write(a WriteArgs) error {
	if err := c.requireHost("Write"); err != nil {
		return err
	}
	kp, kn, kt, err := hostData("Key", a.Key)
	if err != nil {
		return err
	}
	vp, vn, vt, err := hostData("Value", a.Value)
	if err != nil {
		return err
	}
	if kt != vt {
		return invalidArg("Key holds %v and Value %v: they must have one element type", kt, vt)
	}
	n, err := toInt32(len(a.SlotMapping), "len(SlotMapping)")
	if err != nil {
		return err
	}
	layer, err := toInt32(a.Layer, "Layer")
	if err != nil {
		return err
	}
	dense := c.info.NumKVHeads * c.info.HeadSize
	for _, x := range []struct {
		name     string
		have, st int
	}{{"Key", kn, a.KeyTokenStride}, {"Value", vn, a.ValueTokenStride}} {
		stride := x.st
		if stride == 0 {
			stride = dense
		}
		if stride < dense {
			return invalidArg("%sTokenStride = %d, must be 0 or >= NumKVHeads * HeadSize = %d", x.name, x.st, dense)
		}
		if need := (int(n)-1)*stride + dense; n > 0 && x.have < need {
			return invalidArg("%s has %d elements, %d tokens need %d", x.name, x.have, n, need)
		}
	}
	var sp *C.int64_t
	if n > 0 {
		sp = (*C.int64_t)(unsafe.Pointer(&a.SlotMapping[0]))
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	// The CPU backend checks every slot against the cache's size.
	err = takeError(C.kvpgo_write(ptr, layer, n, C.int32_t(kt), kp, vp,
		C.int64_t(a.KeyTokenStride), C.int64_t(a.ValueTokenStride), sp, 0))
	runtime.KeepAlive(c)
	runtime.KeepAlive(a.Key)
	runtime.KeepAlive(a.Value)
	runtime.KeepAlive(a.SlotMapping)
	return err
}

// WriteRaw writes K and V through addresses in the cache's memory space
// (kvp_cache_write), for CUDA caches: it launches on stream without
// synchronizing. The caller answers for the addresses: they must cover
// NumTokens tokens at the given strides until the write has run, and every
// slot must be -1 or below NumBlocks*BlockSize.
func (c *Cache) WriteRaw(a RawWriteArgs, stream uintptr) error {
	layer, err := toInt32(a.Layer, "Layer")
	if err != nil {
		return err
	}
	n, err := toInt32(a.NumTokens, "NumTokens")
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	err = takeError(C.kvpgo_write_raw(ptr, layer, n, C.int32_t(a.InputDType), C.uintptr_t(a.Key),
		C.uintptr_t(a.Value), C.int64_t(a.KeyTokenStride), C.int64_t(a.ValueTokenStride),
		C.uintptr_t(a.SlotMapping), C.uintptr_t(stream)))
	runtime.KeepAlive(c)
	return err
}

// WriteStats is the write counters (synchronizes with the cache's device).
func (c *Cache) WriteStats() (WriteStats, error) {
	ptr, err := c.acquire()
	if err != nil {
		return WriteStats{}, err
	}
	defer c.mu.RUnlock()
	var s C.kvp_write_stats
	C.kvp_write_stats_init(&s)
	err = takeError(C.kvp_cache_get_write_stats(ptr, &s))
	runtime.KeepAlive(c)
	return WriteStats{NonFinite: uint64(s.non_finite), Saturated: uint64(s.saturated)}, err
}

// ResetWriteStats sets the write counters to zero.
func (c *Cache) ResetWriteStats() error {
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	err = takeError(C.kvp_cache_reset_write_stats(ptr))
	runtime.KeepAlive(c)
	return err
}

// ---- Block copies -----------------------------------------------------------------

// CopyBlocks copies block p[0] to block p[1] for each pair, in every layer,
// data and scales together (CPU cache; destinations distinct and not also
// sources).
func (c *Cache) CopyBlocks(pairs [][2]int32) error {
	if err := c.requireHost("CopyBlocks"); err != nil {
		return err
	}
	n, err := toInt32(len(pairs), "len(pairs)")
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var p *C.int32_t
	if n > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&pairs[0][0]))
	}
	err = takeError(C.kvpgo_copy_blocks(ptr, p, n, 0))
	runtime.KeepAlive(c)
	runtime.KeepAlive(pairs)
	return err
}

// CopyBlocksRaw is kvp_cache_copy_blocks with the pairs at an address in
// the cache's memory space (2*numPairs int32 block ids), for CUDA caches.
func (c *Cache) CopyBlocksRaw(pairs uintptr, numPairs int, stream uintptr) error {
	n, err := toInt32(numPairs, "numPairs")
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	err = takeError(C.kvpgo_copy_blocks_raw(ptr, C.uintptr_t(pairs), n, C.uintptr_t(stream)))
	runtime.KeepAlive(c)
	return err
}

// TransferBlocksFrom copies block p[0] of src to block p[1] of c for each
// pair (two caches of one geometry, e.g. a GPU cache and its CPU swap
// space), ordered by stream.
func (c *Cache) TransferBlocksFrom(src *Cache, pairs [][2]int32, stream uintptr) error {
	n, err := toInt32(len(pairs), "len(pairs)")
	if err != nil {
		return err
	}
	ptr, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	sptr := ptr
	if src != c { // one shared lock per goroutine: RWMutex read locks do not nest safely
		if sptr, err = src.acquire(); err != nil {
			return err
		}
		defer src.mu.RUnlock()
	}
	var p *C.int32_t
	if n > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&pairs[0][0]))
	}
	err = takeError(C.kvpgo_transfer_blocks(ptr, sptr, p, n, C.uintptr_t(stream)))
	runtime.KeepAlive(c)
	runtime.KeepAlive(src)
	runtime.KeepAlive(pairs)
	return err
}
