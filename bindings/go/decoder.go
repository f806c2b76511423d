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
	h, err := d.hostCall("Decode", a.QueryLen, attention{Layer: a.Layer, Q: a.Q, Out: a.Out,
		QTokenStride: a.QTokenStride, BlockTable: a.BlockTable, BlockTableWidth: a.BlockTableWidth,
		BlockTableStride: a.BlockTableStride, SeqLens: a.SeqLens, SlidingWindow: a.SlidingWindow,
		SMScale: a.SMScale, LogitsSoftCap: a.LogitsSoftCap, ALiBiSlopes: a.ALiBiSlopes, LSE: a.LSE})
	if err != nil {
		return err
	}
	n := len(a.SeqLens)
	rows := n * h.queryLen
	if rows > 0 {
		if err := checkSizes(append(h.tokenSizes(rows), h.tableSize(n)),
			"for %d sequences x %d query tokens", n, h.queryLen); err != nil {
			return err
		}
	}
	if err := h.checkLSEAndALiBi(rows); err != nil {
		return err
	}
	// The CPU backend checks every length against MaxContextLen and the
	// table width, and every block id it reads against NumBlocks.
	return d.run(h, false, nil)
}

// DecodeRaw is kvp_decode with addresses in the cache's memory space, for
// CUDA caches: it launches on stream without allocating or synchronizing.
// The caller answers for the addresses: they must cover what the header's
// definition reads and writes until the decode has run, with block ids
// below NumBlocks and lengths within MaxContextLen and the table.
func (d *Decoder) DecodeRaw(a RawDecodeArgs, stream uintptr) error {
	return d.runRaw(rawAttention{Layer: a.Layer, NumSeqs: a.NumSeqs, SlidingWindow: a.SlidingWindow,
		SMScale: a.SMScale, LogitsSoftCap: a.LogitsSoftCap, Q: a.Q, QTokenStride: a.QTokenStride,
		BlockTable: a.BlockTable, BlockTableStride: a.BlockTableStride, BlockTableWidth: a.BlockTableWidth,
		SeqLens: a.SeqLens, ALiBiSlopes: a.ALiBiSlopes, Out: a.Out, OutTokenStride: a.OutTokenStride,
		LSE: a.LSE}, false, a.QueryLen, 0, stream)
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
	// No QueryLen: 1 passes its checks.
	h, err := d.hostCall("Attend", 1, attention{Layer: a.Layer, Q: a.Q, Out: a.Out,
		QTokenStride: a.QTokenStride, BlockTable: a.BlockTable, BlockTableWidth: a.BlockTableWidth,
		BlockTableStride: a.BlockTableStride, SeqLens: a.SeqLens, SlidingWindow: a.SlidingWindow,
		SMScale: a.SMScale, LogitsSoftCap: a.LogitsSoftCap, ALiBiSlopes: a.ALiBiSlopes, LSE: a.LSE})
	if err != nil {
		return err
	}
	n := len(a.SeqLens)
	rows := 0
	if n > 0 {
		if len(a.QueryStarts) < n+1 {
			return invalidArg("QueryStarts has %d elements, needs len(SeqLens) + 1 = %d", len(a.QueryStarts), n+1)
		}
		if err := checkSizes([]size{h.tableSize(n)}, "for %d sequences", n); err != nil {
			return err
		}
		// A negative total is left to the library, which names it.
		if last := int(a.QueryStarts[n]); last > 0 {
			rows = last
		}
	}
	if rows > 0 {
		if err := checkSizes(h.tokenSizes(rows), "for QueryStarts[%d] = %d query tokens", n, rows); err != nil {
			return err
		}
	}
	if err := h.checkLSEAndALiBi(rows); err != nil {
		return err
	}
	// The CPU backend checks QueryStarts (so that no token past
	// QueryStarts[len(SeqLens)] is read or written), every length and every
	// block id on the host before it touches memory.
	return d.run(h, true, a.QueryStarts)
}

// AttendRaw is kvp_attend with addresses in the cache's memory space, for
// CUDA caches: it launches on stream without allocating or synchronizing.
// The caller answers for the addresses: they must cover what the header's
// definition reads and writes until the call has run, with QueryStarts
// from 0, non-decreasing and within the capacity, block ids below
// NumBlocks and lengths within MaxContextLen and the table.
func (d *Decoder) AttendRaw(a RawAttendArgs, stream uintptr) error {
	// No QueryLen: 1 passes its checks.
	return d.runRaw(rawAttention{Layer: a.Layer, NumSeqs: a.NumSeqs, SlidingWindow: a.SlidingWindow,
		SMScale: a.SMScale, LogitsSoftCap: a.LogitsSoftCap, Q: a.Q, QTokenStride: a.QTokenStride,
		BlockTable: a.BlockTable, BlockTableStride: a.BlockTableStride, BlockTableWidth: a.BlockTableWidth,
		SeqLens: a.SeqLens, ALiBiSlopes: a.ALiBiSlopes, Out: a.Out, OutTokenStride: a.OutTokenStride,
		LSE: a.LSE}, true, 1, a.QueryStarts, stream)
}

// ---- What Decode and Attend share ---------------------------------------------

// attention is the fields DecodeArgs and AttendArgs share: those of
// kvp_decode_args and kvp_attend_args, in Go memory.
type attention struct {
	Layer                             int
	Q, Out                            any
	QTokenStride                      int
	BlockTable, SeqLens               []int32
	BlockTableWidth, BlockTableStride int
	SlidingWindow                     int
	SMScale, LogitsSoftCap            float32
	ALiBiSlopes, LSE                  []float32
}

// rawAttention is the fields RawDecodeArgs and RawAttendArgs share.
type rawAttention struct {
	Layer, NumSeqs, SlidingWindow, BlockTableWidth int
	SMScale, LogitsSoftCap                         float32
	Q, BlockTable, SeqLens, ALiBiSlopes, Out, LSE  uintptr
	QTokenStride, BlockTableStride, OutTokenStride int64
}

// cInts is the int32 fields of kvp_decode_args and kvp_attend_args, and
// kvp_decode_args.query_len.
type cInts struct{ layer, numSeqs, queryLen, window, width C.int32_t }

// toCInts converts them, failing on the first that does not fit.
func toCInts(layer, numSeqs int, numSeqsName string, queryLen, window, width int) (cInts, error) {
	var c cInts
	for _, x := range []struct {
		to   *C.int32_t
		n    int
		name string
	}{{&c.layer, layer, "Layer"}, {&c.numSeqs, numSeqs, numSeqsName}, {&c.queryLen, queryLen, "QueryLen"},
		{&c.window, window, "SlidingWindow"}, {&c.width, width, "BlockTableWidth"}} {
		n, err := toInt32(x.n, x.name)
		if err != nil {
			return c, err
		}
		*x.to = n
	}
	return c, nil
}

// host is a Decode or Attend call on Go memory, checked as far as the
// fields the two share go.
type host struct {
	attention
	queryLen         int // Decode's (0 taken as 1); 1 for Attend
	heads, dense     int // NumQueryHeads, NumQueryHeads*HeadSize
	qStride, tStride int // QTokenStride and BlockTableStride, 0 resolved
	q, out           unsafe.Pointer
	qLen, outLen     int // elements of Q and Out
	c                cInts
}

// hostCall checks what Decode and Attend (op) check alike, in the order
// both check it.
func (d *Decoder) hostCall(op string, queryLen int, a attention) (*host, error) {
	if err := d.cache.requireHost(op); err != nil {
		return nil, err
	}
	h := &host{attention: a, queryLen: queryLen}
	var qt, ot DType
	var err error
	if h.q, h.qLen, qt, err = hostData("Q", a.Q); err != nil {
		return nil, err
	}
	if h.out, h.outLen, ot, err = hostData("Out", a.Out); err != nil {
		return nil, err
	}
	if qt != d.config.QDType {
		return nil, invalidArg("Q holds %v, the decoder was created with QDType %v", qt, d.config.QDType)
	}
	if ot != d.config.OutDType {
		return nil, invalidArg("Out holds %v, the decoder was created with OutDType %v", ot, d.config.OutDType)
	}
	if h.queryLen == 0 {
		h.queryLen = 1
	}
	if h.queryLen < 1 {
		return nil, invalidArg("QueryLen = %d, must be >= 1", queryLen)
	}
	if a.BlockTableWidth < 1 {
		return nil, invalidArg("BlockTableWidth = %d, must be >= 1", a.BlockTableWidth)
	}
	if h.c, err = toCInts(a.Layer, len(a.SeqLens), "len(SeqLens)", h.queryLen, a.SlidingWindow,
		a.BlockTableWidth); err != nil {
		return nil, err
	}
	h.heads = d.config.NumQueryHeads
	h.dense = h.heads * d.cache.info.HeadSize
	h.qStride, h.tStride = a.QTokenStride, a.BlockTableStride
	if h.qStride == 0 {
		h.qStride = h.dense
	}
	if h.tStride == 0 {
		h.tStride = a.BlockTableWidth
	}
	if h.qStride < h.dense {
		return nil, invalidArg("QTokenStride = %d, must be 0 or >= NumQueryHeads * HeadSize = %d", a.QTokenStride, h.dense)
	}
	if h.tStride < a.BlockTableWidth {
		return nil, invalidArg("BlockTableStride = %d, must be 0 or >= BlockTableWidth = %d", a.BlockTableStride, a.BlockTableWidth)
	}
	return h, nil
}

// size is a buffer's elements: those it has and those the call needs.
type size struct {
	name       string
	have, need int
}

// tokenSizes is the sizes of Q and Out for rows query tokens.
func (h *host) tokenSizes(rows int) []size {
	return []size{{"Q", h.qLen, (rows-1)*h.qStride + h.dense}, {"Out", h.outLen, rows * h.dense}}
}

// tableSize is the size of BlockTable for n sequences.
func (h *host) tableSize(n int) size {
	return size{"BlockTable", len(h.BlockTable), (n-1)*h.tStride + h.BlockTableWidth}
}

// checkSizes fails on the first of sizes short of its need; format and
// args end the message.
func checkSizes(sizes []size, format string, args ...any) error {
	for _, s := range sizes {
		if s.have < s.need {
			return invalidArg("%s has %d elements, needs %d "+format, append([]any{s.name, s.have, s.need}, args...)...)
		}
	}
	return nil
}

// checkLSEAndALiBi checks LSE for rows query tokens, and ALiBiSlopes.
func (h *host) checkLSEAndALiBi(rows int) error {
	if rows > 0 && h.LSE != nil && len(h.LSE) < rows*h.heads {
		return invalidArg("LSE has %d elements, needs %d", len(h.LSE), rows*h.heads)
	}
	if h.ALiBiSlopes != nil && len(h.ALiBiSlopes) < h.heads {
		return invalidArg("ALiBiSlopes has %d values, needs NumQueryHeads = %d", len(h.ALiBiSlopes), h.heads)
	}
	return nil
}

// first is the address of s[0], nil for an empty s.
func first[T any](s []T) *T {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

// run calls kvp_attend with queryStarts where attend is set, else
// kvp_decode, on the checked call h.
func (d *Decoder) run(h *host, attend bool, queryStarts []int32) error {
	sp := (*C.int32_t)(unsafe.Pointer(first(queryStarts)))
	tp := (*C.int32_t)(unsafe.Pointer(first(h.BlockTable)))
	lp := (*C.int32_t)(unsafe.Pointer(first(h.SeqLens)))
	ap := (*C.float)(unsafe.Pointer(first(h.ALiBiSlopes)))
	lsep := (*C.float)(unsafe.Pointer(first(h.LSE)))
	err := d.call(func(p *C.kvp_decoder) *C.kvp_error {
		return C.kvpgo_attention(p, cFlag(attend), h.c.queryLen, sp, h.c.layer, h.c.numSeqs, h.c.window,
			C.float(h.SMScale), C.float(h.LogitsSoftCap), h.q, C.int64_t(h.qStride), tp, C.int64_t(h.tStride),
			h.c.width, lp, ap, h.out, 0, lsep, 0)
	})
	runtime.KeepAlive(h.Q)
	runtime.KeepAlive(h.Out)
	runtime.KeepAlive(queryStarts)
	runtime.KeepAlive(h.BlockTable)
	runtime.KeepAlive(h.SeqLens)
	runtime.KeepAlive(h.ALiBiSlopes)
	runtime.KeepAlive(h.LSE)
	return err
}

// runRaw is run for addresses in the cache's memory space, launched on
// stream.
func (d *Decoder) runRaw(a rawAttention, attend bool, queryLen int, queryStarts, stream uintptr) error {
	c, err := toCInts(a.Layer, a.NumSeqs, "NumSeqs", queryLen, a.SlidingWindow, a.BlockTableWidth)
	if err != nil {
		return err
	}
	return d.call(func(p *C.kvp_decoder) *C.kvp_error {
		return C.kvpgo_attention_raw(p, cFlag(attend), c.queryLen, C.uintptr_t(queryStarts), c.layer,
			c.numSeqs, c.window, C.float(a.SMScale), C.float(a.LogitsSoftCap), C.uintptr_t(a.Q),
			C.int64_t(a.QTokenStride), C.uintptr_t(a.BlockTable), C.int64_t(a.BlockTableStride), c.width,
			C.uintptr_t(a.SeqLens), C.uintptr_t(a.ALiBiSlopes), C.uintptr_t(a.Out),
			C.int64_t(a.OutTokenStride), C.uintptr_t(a.LSE), C.uintptr_t(stream))
	})
}

// call runs f on the open decoder, serialized with its other calls.
func (d *Decoder) call(f func(*C.kvp_decoder) *C.kvp_error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return invalidArg("decoder is closed")
	}
	err := takeError(f(d.ptr))
	runtime.KeepAlive(d)
	return err
}

// cFlag is b as a C int32 (1 or 0).
func cFlag(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}
