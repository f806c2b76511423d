// SPDX-License-Identifier: Apache-2.0

// Decoder.Attend (kvp_attend, ABI 1.3) on the CPU backend: a ragged batch
// (5, 0 and 2 query tokens at contexts 9, 4 and 2) against the binding's
// own Decode of each sequence alone, bit for bit (the CPU backend computes
// both in double and rounds once), and against the float64 reference of
// kvpage_test.go; errors; DecodeConfig.MaxQueryTokens.
package kvpage

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

var (
	aContexts = []int{9, 4, 2}
	aChunks   = []int{5, 0, 2} // query tokens per sequence
)

const aRow = tQHeads * tD

// ragged is the Attend tests' batch: an FP16 cache holding aContexts, its
// models, its block table (width 2), and the query boundaries of aChunks.
type ragged struct {
	cache  *Cache
	models []*seqKV
	table  *BlockTable
	starts []int32
	tokens int // starts[len(aChunks)]
}

func newRagged(t *testing.T, r *rand.Rand) ragged {
	cfg := DefaultCacheConfig()
	cfg.NumBlocks, cfg.BlockSize, cfg.NumKVHeads, cfg.HeadSize = 8, 8, tKVHeads, tD
	cfg.KDType, cfg.VDType = FP16, FP16
	cache := must(NewCache(cfg))
	seqs, models := writeSeqs(t, r, cache, aContexts)
	starts := []int32{0}
	for _, n := range aChunks {
		starts = append(starts, starts[len(starts)-1]+int32(n))
	}
	return ragged{cache, models, must(cache.BlockTable(seqs, 2)), starts, int(starts[len(aChunks)])}
}

// attendConfig is the FP32 decoder of the Attend tests.
func attendConfig(maxQueryLen int) DecodeConfig {
	return DecodeConfig{NumQueryHeads: tQHeads, MaxNumSeqs: 3, MaxContextLen: 32, MaxQueryLen: maxQueryLen,
		QDType: FP32, OutDType: FP32}
}

func TestAttendRaggedBatchEqualsDecodePerSequence(t *testing.T) {
	r, seed := newRng(t)
	g := newRagged(t, r)
	cache, models, table, starts, tokens := g.cache, g.models, g.table, g.starts, g.tokens
	defer cache.Close()
	cfg := attendConfig(5)
	eq(t, "QueryTokenCapacity", cfg.QueryTokenCapacity(), 15)
	dec := must(cache.NewDecoder(cfg))
	defer dec.Close()
	for _, o := range []refOptions{{}, {smScale: float64(float32(0.1)), softCap: 4, window: 3, alibi: true}} {
		q := normals(r, tokens*aRow)
		a := AttendArgs{Q: q, QueryStarts: starts, BlockTable: table.Table, BlockTableWidth: table.Width,
			SeqLens: table.SeqLens, SMScale: float32(o.smScale), LogitsSoftCap: float32(o.softCap),
			SlidingWindow: o.window}
		if o.alibi {
			a.ALiBiSlopes = alibiSlopes()
		}
		// Two rows past the last token: Attend leaves them alone.
		a.Out, a.LSE = poison32((tokens+2)*aRow), poison32((tokens+2)*tQHeads)
		ok(t, dec.Attend(a))
		out := a.Out.([]float32)
		for _, x := range append(append([]float32(nil), out[tokens*aRow:]...), a.LSE[tokens*tQHeads:]...) {
			if !math.IsNaN(float64(x)) {
				t.Fatalf("Attend wrote past QueryStarts[3] (seed %d)", seed)
			}
		}
		for s, n := range aChunks {
			if n == 0 {
				continue
			}
			lo, hi := int(starts[s]), int(starts[s+1])
			want, wantLSE := poison32(n*aRow), poison32(n*tQHeads)
			ok(t, dec.Decode(DecodeArgs{Q: q[lo*aRow : hi*aRow], QueryLen: n,
				BlockTable: table.Table[s*table.Width : (s+1)*table.Width], BlockTableWidth: table.Width,
				SeqLens: table.SeqLens[s : s+1], SMScale: a.SMScale, LogitsSoftCap: a.LogitsSoftCap,
				SlidingWindow: a.SlidingWindow, ALiBiSlopes: a.ALiBiSlopes, Out: want, LSE: wantLSE}))
			for i, w := range want {
				if math.IsNaN(float64(w)) || math.Float32bits(out[lo*aRow+i]) != math.Float32bits(w) {
					t.Fatalf("sequence %d: out %d is %v, Decode's %v (seed %d)", s, i, out[lo*aRow+i], w, seed)
				}
			}
			for i, w := range wantLSE {
				if math.Float32bits(a.LSE[lo*tQHeads+i]) != math.Float32bits(w) {
					t.Fatalf("sequence %d: lse %d is %v, Decode's %v (seed %d)", s, i, a.LSE[lo*tQHeads+i], w, seed)
				}
			}
			// Token i sits at position p = L - n + i: one query token over
			// the first p + 1 tokens.
			for i := 0; i < n; i++ {
				upto := models[s].clone()
				upto.truncate(aContexts[s] - n + i + 1)
				row := q[(lo+i)*aRow : (lo+i+1)*aRow]
				ref, _ := reference(toF64(row), []*seqKV{&upto}, o)
				expectClose(t, "attend vs reference", seed, out[(lo+i)*aRow:(lo+i+1)*aRow], ref,
					math.Ldexp(1, -20), 1e-6)
			}
		}
	}
	// No sequences: a no-op that succeeds.
	ok(t, dec.Attend(AttendArgs{Q: []float32{}, Out: []float32{}, QueryStarts: []int32{0},
		BlockTableWidth: 1}))
}

func TestAttendErrorsAndMaxQueryTokens(t *testing.T) {
	r, _ := newRng(t)
	g := newRagged(t, r)
	cache, table, starts, tokens := g.cache, g.table, g.starts, g.tokens
	defer cache.Close()
	q, out := normals(r, tokens*aRow), make([]float32, tokens*aRow)
	args := func(starts []int32) AttendArgs {
		return AttendArgs{Q: q, Out: out, QueryStarts: starts, BlockTable: table.Table,
			BlockTableWidth: table.Width, SeqLens: table.SeqLens}
	}
	cfg := attendConfig(2)
	eq(t, "DefaultDecodeConfig().MaxQueryTokens", DefaultDecodeConfig().MaxQueryTokens, 0)

	// Set explicitly, MaxQueryTokens is the capacity whatever MaxQueryLen is.
	big := cfg
	big.MaxQueryTokens = tokens
	dec := must(cache.NewDecoder(big))
	defer dec.Close()
	eq(t, "Config().MaxQueryTokens", dec.Config().MaxQueryTokens, tokens)
	ok(t, dec.Attend(args(starts)))
	for i, x := range out {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("out %d = %v", i, x)
		}
	}
	// From the library: bad QueryStarts, named.
	for _, bad := range [][]int32{{0, 5, 3, 7}, {1, 5, 5, 7}, {0, 1, 6, 7}} {
		if err := dec.Attend(args(bad)); !errors.Is(err, CodeInvalidArgument) ||
			!strings.Contains(err.Error(), "query_starts") {
			t.Fatalf("QueryStarts %v: %v", bad, err)
		}
	}
	// From the binding: too few boundaries, too few rows.
	if err := dec.Attend(args(starts[:3])); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "QueryStarts has 3 elements") {
		t.Fatalf("short QueryStarts: %v", err)
	}
	short := args(starts)
	short.Out = out[:6*aRow]
	if err := dec.Attend(short); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "QueryStarts[3] = 7") {
		t.Fatalf("short Out: %v", err)
	}

	// The default: MaxNumSeqs * MaxQueryLen = 6 < 7 tokens.
	eq(t, "QueryTokenCapacity", cfg.QueryTokenCapacity(), 6)
	small := must(cache.NewDecoder(cfg))
	defer small.Close()
	if err := small.Attend(args(starts)); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "max_query_tokens = 6") {
		t.Fatalf("7 tokens past the default capacity: %v", err)
	}
	// The value reaches kvp_decode_config.max_query_tokens.
	neg := cfg
	neg.MaxQueryTokens = -1
	if _, err := cache.NewDecoder(neg); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "max_query_tokens = -1") {
		t.Fatalf("MaxQueryTokens = -1: %v", err)
	}
}
