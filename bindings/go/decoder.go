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

// DecodeConfig is the capacities a decoder's launches are shaped by (one
// CUDA graph serves every batch within them) and its query and output
// types. [DefaultDecodeConfig] gives the library's defaults.
type DecodeConfig struct {
	NumQueryHeads int   // a multiple of the cache's NumKVHeads (must be set)
	MaxNumSeqs    int   // must be set
	MaxContextLen int   // tokens; must be set
	MaxQueryLen   int   // query tokens per sequence; default 1
	QDType        DType // FP32, FP16 or BF16; default BF16
	OutDType      DType // FP32, FP16 or BF16; default BF16
	// Precise mode (ABI 1.2; default off): every decode of the decoder
	// computes in FP32 from end to end, queries included, so that the LSE
	// is accurate to FP32 rounding (for merging partial results by their
	// LSE). On CUDA it runs the CUDA-core kernel, slower for GQA groups and
	// quantized caches; the CPU backend is precise in every mode.
	Precise bool
	// MaxQueryTokens (ABI 1.3) is the query tokens of one [Decoder.Attend]
	// call, all sequences together: the capacity its launches are shaped
	// by. Default 0 = MaxNumSeqs * MaxQueryLen.
	MaxQueryTokens int
}

// DefaultDecodeConfig is the library's default configuration
// (kvp_decode_config_init).
func DefaultDecodeConfig() DecodeConfig {
	var c C.kvp_decode_config
	C.kvp_decode_config_init(&c)
	return DecodeConfig{
		NumQueryHeads: int(c.num_query_heads), MaxNumSeqs: int(c.max_num_seqs),
		MaxContextLen: int(c.max_context_len), MaxQueryLen: int(c.max_query_len),
		QDType: DType(c.q_dtype), OutDType: DType(c.out_dtype),
		Precise: c.precise != 0, MaxQueryTokens: int(c.max_query_tokens),
	}
}

// QueryTokenCapacity is the query tokens one [Decoder.Attend] call may
// bring: MaxQueryTokens, or MaxNumSeqs * MaxQueryLen where it is 0.
func (cfg DecodeConfig) QueryTokenCapacity() int {
	if cfg.MaxQueryTokens != 0 {
		return cfg.MaxQueryTokens
	}
	return cfg.MaxNumSeqs * cfg.MaxQueryLen
}

// precise is cfg.Precise as kvp_decode_config.precise takes it.
func (cfg DecodeConfig) precise() int32 {
	if cfg.Precise {
		return 1
	}
	return 0
}

func (cfg DecodeConfig) toC(workspace uintptr, workspaceBytes uint64, precise int32) (C.kvp_decode_config, error) {
	var c C.kvp_decode_config
	var v [5]C.int32_t
	for i, x := range []struct {
		n    int
		name string
	}{{cfg.NumQueryHeads, "NumQueryHeads"}, {cfg.MaxNumSeqs, "MaxNumSeqs"},
		{cfg.MaxContextLen, "MaxContextLen"}, {cfg.MaxQueryLen, "MaxQueryLen"},
		{cfg.MaxQueryTokens, "MaxQueryTokens"}} {
		n, err := toInt32(x.n, "cfg."+x.name)
		if err != nil {
			return c, err
		}
		v[i] = n
	}
	C.kvpgo_decode_config(&c, v[0], v[1], v[2], v[3], C.int32_t(cfg.QDType), C.int32_t(cfg.OutDType),
		C.uintptr_t(workspace), C.uint64_t(workspaceBytes), C.int32_t(precise), v[4])
	return c, nil
}

// DecodeWorkspaceSize is the workspace a decoder with cfg needs (0 on the
// CPU backend).
func (c *Cache) DecodeWorkspaceSize(cfg DecodeConfig) (uint64, error) {
	cc, err := cfg.toC(0, 0, cfg.precise())
	if err != nil {
		return 0, err
	}
	ptr, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	var n C.uint64_t
	err = takeError(C.kvp_decode_workspace_size(ptr, &cc, &n))
	runtime.KeepAlive(c)
	return uint64(n), err
}

// Decoder runs decode attention over a cache with fixed capacities. Its
// Decode calls are serialized (the header forbids concurrent decodes on one
// decoder); use one decoder per goroutine for parallel decodes. Close it
// before its cache.
type Decoder struct {
	mu     sync.Mutex // held by Decode and Close
	ptr    *C.kvp_decoder
	cache  *Cache // keeps the cache reachable while the decoder is
	config DecodeConfig
}

// NewDecoder creates a decoder for the cache that owns its workspace
// (kvp_decoder_create).
func (c *Cache) NewDecoder(cfg DecodeConfig) (*Decoder, error) {
	return c.NewDecoderWithWorkspace(cfg, 0, 0)
}

// NewDecoderWithWorkspace creates a decoder using a caller-owned workspace
// at an address in the cache's memory space, 256-byte aligned, of at least
// [Cache.DecodeWorkspaceSize] bytes, which must stay valid and unused by
// anything else until the decoder is closed. 0 means the decoder allocates.
func (c *Cache) NewDecoderWithWorkspace(cfg DecodeConfig, workspace uintptr, workspaceBytes uint64) (*Decoder, error) {
	return c.newDecoder(cfg, workspace, workspaceBytes, cfg.precise())
}

// newDecoder is NewDecoderWithWorkspace with kvp_decode_config.precise as
// the C API takes it (the tests pass a value the library refuses, to see it
// arrive).
func (c *Cache) newDecoder(cfg DecodeConfig, workspace uintptr, workspaceBytes uint64, precise int32) (*Decoder, error) {
	cc, err := cfg.toC(workspace, workspaceBytes, precise)
	if err != nil {
		return nil, err
	}
	ptr, err := c.acquire()
	if err != nil {
		return nil, err
	}
	defer c.mu.RUnlock()
	var d *C.kvp_decoder
	err = takeError(C.kvp_decoder_create(ptr, &cc, &d))
	runtime.KeepAlive(c)
	if err != nil {
		return nil, err
	}
	// Counted under the cache's shared lock: Close (exclusive) sees it.
	atomic.AddInt32(&c.decoders, 1)
	dec := &Decoder{ptr: d, cache: c, config: cfg}
	runtime.SetFinalizer(dec, (*Decoder).finalize)
	return dec, nil
}

func (d *Decoder) finalize() {
	if d.ptr != nil {
		C.kvp_decoder_destroy(d.ptr)
		d.ptr = nil
		atomic.AddInt32(&d.cache.decoders, -1)
	}
}

// Close releases the decoder. Closing twice is a no-op.
func (d *Decoder) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return nil
	}
	C.kvp_decoder_destroy(d.ptr)
	d.ptr = nil
	atomic.AddInt32(&d.cache.decoders, -1)
	runtime.SetFinalizer(d, nil)
	return nil
}

// Config is the configuration the decoder was created with.
func (d *Decoder) Config() DecodeConfig { return d.config }

// DecodeArgs is what [Decoder.Decode] attends, in Go memory: for sequence
// s < len(SeqLens), query token i < QueryLen and query head h,
// Q[(s*QueryLen + i)*QTokenStride + h*HeadSize + d] against the first
// SeqLens[s] tokens named by row s of BlockTable
// (BlockTable[s*BlockTableStride + j], j < BlockTableWidth); the result goes
// to Out[(s*QueryLen + i)*NumQueryHeads*HeadSize + h*HeadSize + d] and,
// unless nil, the log-sum-exp to LSE[(s*QueryLen + i)*NumQueryHeads + h].
// Q and Out are []float32, []Float16 or []BFloat16 matching the decoder's
// QDType and OutDType. See kvp_decode_args in the C header for the exact
// definition (ALiBi, sliding window, soft-cap, causal query tokens).
type DecodeArgs struct {
	Layer            int
	Q                any
	QTokenStride     int // elements; 0 = NumQueryHeads*HeadSize
	QueryLen         int // 1..MaxQueryLen; 0 means 1
	BlockTable       []int32
	BlockTableWidth  int
	BlockTableStride int // elements; 0 = BlockTableWidth
	SeqLens          []int32
	SlidingWindow    int       // tokens attended per query, 0 = all
	SMScale          float32   // 0 = 1/sqrt(HeadSize)
	LogitsSoftCap    float32   // 0 = off
	ALiBiSlopes      []float32 // one per query head, or nil
	Out              any
	LSE              []float32 // or nil
}

// RawDecodeArgs is [Decoder.DecodeRaw]'s arguments (kvp_decode_args):
// addresses in the cache's memory space, device pointers for a CUDA cache.
type RawDecodeArgs struct {
	Layer, NumSeqs, QueryLen, SlidingWindow int
	SMScale, LogitsSoftCap                  float32
	Q                                       uintptr
	QTokenStride                            int64
	BlockTable                              uintptr
	BlockTableStride                        int64
	BlockTableWidth                         int
	SeqLens, ALiBiSlopes, Out               uintptr
	OutTokenStride                          int64
	LSE                                     uintptr
}

// Decode decodes a batch held in Go memory over a CPU cache.
func (d *Decoder) Decode(a DecodeArgs) error {
	if err := d.cache.requireHost("Decode"); err != nil {
		return err
	}
	qp, qn, qt, err := hostData("Q", a.Q)
	if err != nil {
		return err
	}
	op, on, ot, err := hostData("Out", a.Out)
	if err != nil {
		return err
	}
	if qt != d.config.QDType {
		return invalidArg("Q holds %v, the decoder was created with QDType %v", qt, d.config.QDType)
	}
	if ot != d.config.OutDType {
		return invalidArg("Out holds %v, the decoder was created with OutDType %v", ot, d.config.OutDType)
	}
	queryLen := a.QueryLen
	if queryLen == 0 {
		queryLen = 1
	}
	if queryLen < 1 {
		return invalidArg("QueryLen = %d, must be >= 1", a.QueryLen)
	}
	if a.BlockTableWidth < 1 {
		return invalidArg("BlockTableWidth = %d, must be >= 1", a.BlockTableWidth)
	}
	var v [6]C.int32_t
	for i, x := range []struct {
		n    int
		name string
	}{{a.Layer, "Layer"}, {len(a.SeqLens), "len(SeqLens)"}, {queryLen, "QueryLen"},
		{a.SlidingWindow, "SlidingWindow"}, {a.BlockTableWidth, "BlockTableWidth"}, {0, ""}} {
		n, err := toInt32(x.n, x.name)
		if err != nil {
			return err
		}
		v[i] = n
	}
	heads := d.config.NumQueryHeads
	dense := heads * d.cache.info.HeadSize
	qStride := a.QTokenStride
	if qStride == 0 {
		qStride = dense
	}
	tStride := a.BlockTableStride
	if tStride == 0 {
		tStride = a.BlockTableWidth
	}
	if qStride < dense {
		return invalidArg("QTokenStride = %d, must be 0 or >= NumQueryHeads * HeadSize = %d", a.QTokenStride, dense)
	}
	if tStride < a.BlockTableWidth {
		return invalidArg("BlockTableStride = %d, must be 0 or >= BlockTableWidth = %d", a.BlockTableStride, a.BlockTableWidth)
	}
	rows := len(a.SeqLens) * queryLen
	if rows > 0 {
		for _, x := range []struct {
			name       string
			have, need int
		}{
			{"Q", qn, (rows-1)*qStride + dense},
			{"Out", on, rows * dense},
			{"BlockTable", len(a.BlockTable), (len(a.SeqLens)-1)*tStride + a.BlockTableWidth},
		} {
			if x.have < x.need {
				return invalidArg("%s has %d elements, needs %d for %d sequences x %d query tokens",
					x.name, x.have, x.need, len(a.SeqLens), queryLen)
			}
		}
		if a.LSE != nil && len(a.LSE) < rows*heads {
			return invalidArg("LSE has %d elements, needs %d", len(a.LSE), rows*heads)
		}
	}
	if a.ALiBiSlopes != nil && len(a.ALiBiSlopes) < heads {
		return invalidArg("ALiBiSlopes has %d values, needs NumQueryHeads = %d", len(a.ALiBiSlopes), heads)
	}
	var tp, lp *C.int32_t
	var ap, lsep *C.float
	if len(a.BlockTable) > 0 {
		tp = (*C.int32_t)(unsafe.Pointer(&a.BlockTable[0]))
	}
	if len(a.SeqLens) > 0 {
		lp = (*C.int32_t)(unsafe.Pointer(&a.SeqLens[0]))
	}
	if len(a.ALiBiSlopes) > 0 {
		ap = (*C.float)(unsafe.Pointer(&a.ALiBiSlopes[0]))
	}
	if len(a.LSE) > 0 {
		lsep = (*C.float)(unsafe.Pointer(&a.LSE[0]))
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return invalidArg("decoder is closed")
	}
	// The CPU backend checks every length against MaxContextLen and the
	// table width, and every block id it reads against NumBlocks.
	err = takeError(C.kvpgo_decode(d.ptr, v[0], v[1], v[2], v[3], C.float(a.SMScale), C.float(a.LogitsSoftCap),
		qp, C.int64_t(qStride), tp, C.int64_t(tStride), v[4], lp, ap, op, 0, lsep, 0))
	runtime.KeepAlive(d)
	runtime.KeepAlive(a.Q)
	runtime.KeepAlive(a.Out)
	runtime.KeepAlive(a.BlockTable)
	runtime.KeepAlive(a.SeqLens)
	runtime.KeepAlive(a.ALiBiSlopes)
	runtime.KeepAlive(a.LSE)
	return err
}

// DecodeRaw is kvp_decode with addresses in the cache's memory space, for
// CUDA caches: it launches on stream without allocating or synchronizing.
// The caller answers for the addresses: they must cover what the header's
// definition reads and writes until the decode has run, with block ids
// below NumBlocks and lengths within MaxContextLen and the table.
func (d *Decoder) DecodeRaw(a RawDecodeArgs, stream uintptr) error {
	var v [6]C.int32_t
	for i, x := range []struct {
		n    int
		name string
	}{{a.Layer, "Layer"}, {a.NumSeqs, "NumSeqs"}, {a.QueryLen, "QueryLen"},
		{a.SlidingWindow, "SlidingWindow"}, {a.BlockTableWidth, "BlockTableWidth"}, {0, ""}} {
		n, err := toInt32(x.n, x.name)
		if err != nil {
			return err
		}
		v[i] = n
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return invalidArg("decoder is closed")
	}
	err := takeError(C.kvpgo_decode_raw(d.ptr, v[0], v[1], v[2], v[3], C.float(a.SMScale),
		C.float(a.LogitsSoftCap), C.uintptr_t(a.Q), C.int64_t(a.QTokenStride), C.uintptr_t(a.BlockTable),
		C.int64_t(a.BlockTableStride), v[4], C.uintptr_t(a.SeqLens), C.uintptr_t(a.ALiBiSlopes),
		C.uintptr_t(a.Out), C.int64_t(a.OutTokenStride), C.uintptr_t(a.LSE), C.uintptr_t(stream)))
	runtime.KeepAlive(d)
	return err
}

// AttendArgs is what [Decoder.Attend] attends, in Go memory: a batch whose
// sequences each bring their own number of query tokens. Sequence
// s < len(SeqLens) owns query tokens QueryStarts[s] .. QueryStarts[s+1]-1,
// the last n_s = QueryStarts[s+1] - QueryStarts[s] tokens of its context of
// SeqLens[s] tokens (n_s <= SeqLens[s]); token i of the chunk sits at
// position SeqLens[s] - n_s + i and attends as [Decoder.Decode]'s query
// token at that position does. Token t is Q[t*QTokenStride + h*HeadSize + d];
// its result goes to Out[t*NumQueryHeads*HeadSize + h*HeadSize + d] and,
// unless nil, its log-sum-exp to LSE[t*NumQueryHeads + h]. See
// kvp_attend_args in the C header.
type AttendArgs struct {
	Layer        int
	Q            any
	QTokenStride int // elements; 0 = NumQueryHeads*HeadSize
	// len(SeqLens)+1 offsets: 0 first, non-decreasing, the last at most the
	// decoder's query token capacity ([DecodeConfig.QueryTokenCapacity]).
	QueryStarts      []int32
	BlockTable       []int32
	BlockTableWidth  int
	BlockTableStride int       // elements; 0 = BlockTableWidth
	SeqLens          []int32   // context lengths, the new tokens included
	SlidingWindow    int       // tokens attended per query, 0 = all
	SMScale          float32   // 0 = 1/sqrt(HeadSize)
	LogitsSoftCap    float32   // 0 = off
	ALiBiSlopes      []float32 // one per query head, or nil
	Out              any
	LSE              []float32 // or nil
}

// RawAttendArgs is [Decoder.AttendRaw]'s arguments (kvp_attend_args):
// addresses in the cache's memory space, device pointers for a CUDA cache.
type RawAttendArgs struct {
	Layer, NumSeqs, SlidingWindow int
	SMScale, LogitsSoftCap        float32
	QueryStarts, Q                uintptr
	QTokenStride                  int64
	BlockTable                    uintptr
	BlockTableStride              int64
	BlockTableWidth               int
	SeqLens, ALiBiSlopes, Out     uintptr
	OutTokenStride                int64
	LSE                           uintptr
}

// Attend runs attention over query chunks of varying lengths (kvp_attend)
// on a batch held in Go memory over a CPU cache. The library checks
// QueryStarts (0 first, non-decreasing, within the capacity, no chunk
// longer than its context) and names it in the error.
func (d *Decoder) Attend(a AttendArgs) error {
	if err := d.cache.requireHost("Attend"); err != nil {
		return err
	}
	qp, qn, qt, err := hostData("Q", a.Q)
	if err != nil {
		return err
	}
	op, on, ot, err := hostData("Out", a.Out)
	if err != nil {
		return err
	}
	if qt != d.config.QDType {
		return invalidArg("Q holds %v, the decoder was created with QDType %v", qt, d.config.QDType)
	}
	if ot != d.config.OutDType {
		return invalidArg("Out holds %v, the decoder was created with OutDType %v", ot, d.config.OutDType)
	}
	if a.BlockTableWidth < 1 {
		return invalidArg("BlockTableWidth = %d, must be >= 1", a.BlockTableWidth)
	}
	var v [4]C.int32_t
	for i, x := range []struct {
		n    int
		name string
	}{{a.Layer, "Layer"}, {len(a.SeqLens), "len(SeqLens)"}, {a.SlidingWindow, "SlidingWindow"},
		{a.BlockTableWidth, "BlockTableWidth"}} {
		n, err := toInt32(x.n, x.name)
		if err != nil {
			return err
		}
		v[i] = n
	}
	heads := d.config.NumQueryHeads
	dense := heads * d.cache.info.HeadSize
	qStride := a.QTokenStride
	if qStride == 0 {
		qStride = dense
	}
	tStride := a.BlockTableStride
	if tStride == 0 {
		tStride = a.BlockTableWidth
	}
	if qStride < dense {
		return invalidArg("QTokenStride = %d, must be 0 or >= NumQueryHeads * HeadSize = %d", a.QTokenStride, dense)
	}
	if tStride < a.BlockTableWidth {
		return invalidArg("BlockTableStride = %d, must be 0 or >= BlockTableWidth = %d", a.BlockTableStride, a.BlockTableWidth)
	}
	n := len(a.SeqLens)
	rows := 0
	if n > 0 {
		if len(a.QueryStarts) < n+1 {
			return invalidArg("QueryStarts has %d elements, needs len(SeqLens) + 1 = %d", len(a.QueryStarts), n+1)
		}
		if need := (n-1)*tStride + a.BlockTableWidth; len(a.BlockTable) < need {
			return invalidArg("BlockTable has %d elements, needs %d for %d sequences", len(a.BlockTable), need, n)
		}
		// A negative total is left to the library, which names it.
		if last := int(a.QueryStarts[n]); last > 0 {
			rows = last
		}
	}
	if rows > 0 {
		for _, x := range []struct {
			name       string
			have, need int
		}{{"Q", qn, (rows-1)*qStride + dense}, {"Out", on, rows * dense}} {
			if x.have < x.need {
				return invalidArg("%s has %d elements, needs %d for QueryStarts[%d] = %d query tokens",
					x.name, x.have, x.need, n, rows)
			}
		}
		if a.LSE != nil && len(a.LSE) < rows*heads {
			return invalidArg("LSE has %d elements, needs %d", len(a.LSE), rows*heads)
		}
	}
	if a.ALiBiSlopes != nil && len(a.ALiBiSlopes) < heads {
		return invalidArg("ALiBiSlopes has %d values, needs NumQueryHeads = %d", len(a.ALiBiSlopes), heads)
	}
	var sp, tp, lp *C.int32_t
	var ap, lsep *C.float
	if len(a.QueryStarts) > 0 {
		sp = (*C.int32_t)(unsafe.Pointer(&a.QueryStarts[0]))
	}
	if len(a.BlockTable) > 0 {
		tp = (*C.int32_t)(unsafe.Pointer(&a.BlockTable[0]))
	}
	if len(a.SeqLens) > 0 {
		lp = (*C.int32_t)(unsafe.Pointer(&a.SeqLens[0]))
	}
	if len(a.ALiBiSlopes) > 0 {
		ap = (*C.float)(unsafe.Pointer(&a.ALiBiSlopes[0]))
	}
	if len(a.LSE) > 0 {
		lsep = (*C.float)(unsafe.Pointer(&a.LSE[0]))
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return invalidArg("decoder is closed")
	}
	// The CPU backend checks QueryStarts (so that no token past
	// QueryStarts[len(SeqLens)] is read or written), every length and every
	// block id on the host before it touches memory.
	err = takeError(C.kvpgo_attend(d.ptr, v[0], v[1], v[2], C.float(a.SMScale), C.float(a.LogitsSoftCap),
		sp, qp, C.int64_t(qStride), tp, C.int64_t(tStride), v[3], lp, ap, op, 0, lsep, 0))
	runtime.KeepAlive(d)
	runtime.KeepAlive(a.Q)
	runtime.KeepAlive(a.Out)
	runtime.KeepAlive(a.QueryStarts)
	runtime.KeepAlive(a.BlockTable)
	runtime.KeepAlive(a.SeqLens)
	runtime.KeepAlive(a.ALiBiSlopes)
	runtime.KeepAlive(a.LSE)
	return err
}

// AttendRaw is kvp_attend with addresses in the cache's memory space, for
// CUDA caches: it launches on stream without allocating or synchronizing.
// The caller answers for the addresses: they must cover what the header's
// definition reads and writes until the call has run, with QueryStarts
// from 0, non-decreasing and within the capacity, block ids below
// NumBlocks and lengths within MaxContextLen and the table.
func (d *Decoder) AttendRaw(a RawAttendArgs, stream uintptr) error {
	var v [4]C.int32_t
	for i, x := range []struct {
		n    int
		name string
	}{{a.Layer, "Layer"}, {a.NumSeqs, "NumSeqs"}, {a.SlidingWindow, "SlidingWindow"},
		{a.BlockTableWidth, "BlockTableWidth"}} {
		n, err := toInt32(x.n, x.name)
		if err != nil {
			return err
		}
		v[i] = n
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return invalidArg("decoder is closed")
	}
	err := takeError(C.kvpgo_attend_raw(d.ptr, v[0], v[1], v[2], C.float(a.SMScale),
		C.float(a.LogitsSoftCap), C.uintptr_t(a.QueryStarts), C.uintptr_t(a.Q), C.int64_t(a.QTokenStride),
		C.uintptr_t(a.BlockTable), C.int64_t(a.BlockTableStride), v[3], C.uintptr_t(a.SeqLens),
		C.uintptr_t(a.ALiBiSlopes), C.uintptr_t(a.Out), C.int64_t(a.OutTokenStride), C.uintptr_t(a.LSE),
		C.uintptr_t(stream)))
	runtime.KeepAlive(d)
	return err
}
