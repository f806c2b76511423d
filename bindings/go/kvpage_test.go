// SPDX-License-Identifier: Apache-2.0

// The binding end to end on the CPU backend, the same scenario as the Rust
// binding's test: sequences (create, append, fork with copy-on-write,
// truncate, free), writes, block tables and decodes checked against a
// float64 attention computed here; then one cache used from several
// goroutines at once, finalizers, and errors.
//
// Inputs are fresh random numbers on every run; the seed is logged on every
// failure and KVPAGE_TEST_SEED=<n> replays one. Outputs are poisoned with
// NaN before each call.
//
// Tolerances (as in the Rust test):
//   - FP16 cache written from FP16 (or FP16-representable FP32) inputs holds
//     them exactly; the CPU backend computes in double and rounds once to
//     the output type, so |out - ref| <= 2^-20 |ref| + 1e-6 for FP32 outputs
//     (half an ulp is 2^-24; slack for the summation order), 2^-10 |ref| +
//     1e-6 for FP16 (half an ulp is 2^-11); LSE (FP32) 1e-5 (1 + |ref|).
//   - INT8 cache: against float64 attention over the cache as stored
//     (dequantized through Cache.Layout), the FP32 tolerance; each stored
//     element within half a quantization step (amax/254 (1 + 2^-10)) of its
//     input.
package kvpage

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	tLayers  = 2
	tBlock   = 16
	tKVHeads = 2
	tQHeads  = 4
	tD       = 64
	tDense   = tKVHeads * tD
)

func newRng(t *testing.T) (*rand.Rand, int64) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("KVPAGE_TEST_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("KVPAGE_TEST_SEED: %v", err)
		}
	}
	t.Logf("seed %d (KVPAGE_TEST_SEED=%d replays it)", seed, seed)
	return rand.New(rand.NewSource(seed)), seed
}

func normals(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// halves are random values exactly representable in FP16.
func halves(r *rand.Rand, n int) []Float16 {
	x := make([]Float16, n)
	for i := range x {
		x[i] = Float16FromFloat32(float32(r.NormFloat64()))
	}
	return x
}

func toF64(x any) []float64 {
	switch s := x.(type) {
	case []float32:
		out := make([]float64, len(s))
		for i, v := range s {
			out[i] = float64(v)
		}
		return out
	case []Float16:
		out := make([]float64, len(s))
		for i, v := range s {
			out[i] = float64(v.Float32())
		}
		return out
	}
	panic(fmt.Sprintf("toF64: %T", x))
}

// seqKV is what a sequence holds in one layer: K and V per token,
// [t][kv_head][d].
type seqKV struct{ k, v []float64 }

func (s *seqKV) len() int       { return len(s.k) / tDense }
func (s *seqKV) push(k, v any)  { s.k = append(s.k, toF64(k)...); s.v = append(s.v, toF64(v)...) }
func (s *seqKV) truncate(n int) { s.k, s.v = s.k[:n*tDense], s.v[:n*tDense] }
func (s seqKV) clone() seqKV {
	return seqKV{append([]float64(nil), s.k...), append([]float64(nil), s.v...)}
}

// writeSeqs creates sequences of lens tokens in cache, writes random FP16 K
// and V to layer 0, and returns them with their models.
func writeSeqs(t *testing.T, r *rand.Rand, cache *Cache, lens []int) ([]SeqID, []*seqKV) {
	var seqs []SeqID
	var models []*seqKV
	for _, n := range lens {
		s := must(cache.CreateSeq())
		slots := must(cache.Append(s, n))
		k, v := halves(r, n*tDense), halves(r, n*tDense)
		ok(t, cache.Write(WriteArgs{Key: k, Value: v, SlotMapping: slots}))
		m := &seqKV{}
		m.push(k, v)
		seqs, models = append(seqs, s), append(models, m)
	}
	return seqs, models
}

func alibiSlopes() []float32   { return []float32{0.5, 0.25, 0.125, 0.0625} }
func poison32(n int) []float32 { x := make([]float32, n); fill(x, float32(math.NaN())); return x }
func fill[T any](x []T, v T) {
	for i := range x {
		x[i] = v
	}
}
func poison16(n int) []Float16 { x := make([]Float16, n); fill(x, Float16(0x7e00)); return x }

type refOptions struct {
	smScale, softCap float64 // 0 = 1/sqrt(D), off
	window           int
	alibi            bool
}

// reference is kvp_decode's definition in float64 for one query token per
// sequence: out [s][h][d] and lse [s][h].
func reference(q []float64, seqs []*seqKV, o refOptions) (out, lse []float64) {
	scale := o.smScale
	if scale == 0 {
		scale = 1 / math.Sqrt(tD)
	}
	slopes := alibiSlopes()
	group := tQHeads / tKVHeads
	out = make([]float64, len(seqs)*tQHeads*tD)
	lse = make([]float64, len(seqs)*tQHeads)
	for s, kv := range seqs {
		n := kv.len()
		pos := n - 1
		for h := 0; h < tQHeads; h++ {
			row := s*tQHeads + h
			lse[row] = math.Inf(-1)
			if n == 0 {
				continue
			}
			kvh := h / group
			type logit struct {
				j int
				l float64
			}
			var ls []logit
			for j := 0; j < n; j++ {
				if o.window > 0 && j+o.window <= pos {
					continue
				}
				dot := 0.0
				for d := 0; d < tD; d++ {
					dot += q[row*tD+d] * kv.k[j*tDense+kvh*tD+d]
				}
				l := scale * dot
				if o.softCap > 0 {
					l = o.softCap * math.Tanh(l/o.softCap)
				}
				if o.alibi {
					l += float64(slopes[h]) * float64(j-pos)
				}
				ls = append(ls, logit{j, l})
			}
			m := math.Inf(-1)
			for _, x := range ls {
				m = math.Max(m, x.l)
			}
			sum := 0.0
			for _, x := range ls {
				sum += math.Exp(x.l - m)
			}
			for _, x := range ls {
				w := math.Exp(x.l-m) / sum
				for d := 0; d < tD; d++ {
					out[row*tD+d] += w * kv.v[x.j*tDense+kvh*tD+d]
				}
			}
			lse[row] = m + math.Log(sum)
		}
	}
	return out, lse
}

func expectClose(t *testing.T, what string, seed int64, got any, want []float64, rel, abs float64) {
	t.Helper()
	g := toF64(got)
	if len(g) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(g), len(want))
	}
	for i := range g {
		if err := math.Abs(g[i] - want[i]); !(err <= abs+rel*math.Abs(want[i])) {
			t.Fatalf("%s (seed %d): element %d is %v, reference %v (|err| %.3g > %.3g + %.3g|ref|)",
				what, seed, i, g[i], want[i], err, abs, rel)
		}
	}
}

// must returns v, or fails the test (by a panic, which go test reports with
// the test's name and the stack) when err is not nil.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func eq[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// ---------------------------------------------------------------------------
// Write + decode + fork + free on an FP16 cache
// ---------------------------------------------------------------------------

func TestWriteDecodeForkFreeFP16(t *testing.T) {
	r, seed := newRng(t)
	const numBlocks = 12
	cfg := DefaultCacheConfig()
	cfg.NumLayers, cfg.NumBlocks, cfg.BlockSize = tLayers, numBlocks, tBlock
	cfg.NumKVHeads, cfg.HeadSize, cfg.KDType, cfg.VDType = tKVHeads, tD, FP16, FP16
	cache := must(NewCache(cfg))
	defer cache.Close()
	info := cache.Info()
	eq(t, "info", fmt.Sprint(info.NumLayers, info.NumBlocks, info.BlockSize, info.NumKVHeads, info.HeadSize,
		info.KDType, info.VDType), "2 12 16 2 64 FP16 FP16")
	eq(t, "BytesPerTokenPerLayer", info.BytesPerTokenPerLayer, int64(2*tDense*2))
	eq(t, "free blocks", must(cache.NumFreeBlocks()), numBlocks)

	// Sequence A: 13 + 7 tokens, so that the second append crosses a block.
	a := must(cache.CreateSeq())
	slotsA := append(must(cache.Append(a, 13)), must(cache.Append(a, 7))...)
	eq(t, "len(A)", must(cache.SeqLen(a)), 20)
	eq(t, "free blocks", must(cache.NumFreeBlocks()), numBlocks-2)
	for i, s := range slotsA {
		if s < 0 || s >= numBlocks*tBlock || s%tBlock != int64(i%tBlock) || s/tBlock != slotsA[i/16*16]/tBlock {
			t.Fatalf("slot of token %d is %d (slots %v)", i, s, slotsA)
		}
	}

	// Layer 0 from FP16 inputs with a padding token (-1, NaN values that
	// must be skipped); layer 1 from FP32 inputs at a padded token stride
	// whose gaps hold NaN (which must not be read).
	modelA := make([]seqKV, tLayers)
	{
		k, v := halves(r, 20*tDense), halves(r, 20*tDense)
		nan := make([]Float16, tDense)
		fill(nan, Float16(0x7e00))
		kw := append(append(append([]Float16{}, k[:7*tDense]...), nan...), k[7*tDense:]...)
		vw := append(append(append([]Float16{}, v[:7*tDense]...), nan...), v[7*tDense:]...)
		sm := append(append(append([]int64{}, slotsA[:7]...), -1), slotsA[7:]...)
		ok(t, cache.Write(WriteArgs{Layer: 0, Key: kw, Value: vw, SlotMapping: sm}))
		modelA[0].push(k, v)
	}
	{
		stride := tDense + 8
		k, v := halves(r, 20*tDense), halves(r, 20*tDense)
		kw, vw := poison32(20*stride), poison32(20*stride)
		for tok := 0; tok < 20; tok++ {
			for i := 0; i < tDense; i++ {
				kw[tok*stride+i] = k[tok*tDense+i].Float32()
				vw[tok*stride+i] = v[tok*tDense+i].Float32()
			}
		}
		ok(t, cache.Write(WriteArgs{Layer: 1, Key: kw[:19*stride+tDense], Value: vw, SlotMapping: slotsA,
			KeyTokenStride: stride, ValueTokenStride: stride}))
		modelA[1].push(k, v)
	}
	eq(t, "non-finite inputs read", must(cache.WriteStats()).NonFinite, uint64(0))

	// Fork: B shares A's two blocks; B's first append copies the shared,
	// partly filled last block (copy-on-write), A's then writes in place.
	b := must(cache.ForkSeq(a))
	if b == a {
		t.Fatal("fork returned the parent's id")
	}
	eq(t, "len(B)", must(cache.SeqLen(b)), 20)
	eq(t, "free blocks after fork", must(cache.NumFreeBlocks()), numBlocks-2)
	slotsB := must(cache.Append(b, 3))
	eq(t, "free blocks after copy-on-write", must(cache.NumFreeBlocks()), numBlocks-3)
	slotsA2 := must(cache.Append(a, 2))
	eq(t, "free blocks after A's append", must(cache.NumFreeBlocks()), numBlocks-3)
	eq(t, "A's new slots", fmt.Sprint(slotsA2), fmt.Sprint([]int64{slotsA[19] + 1, slotsA[19] + 2}))
	eq(t, "B's first new slot offset", slotsB[0]%tBlock, int64(4))
	if slotsB[0]/tBlock == slotsA[19]/tBlock {
		t.Fatal("B appended into A's block")
	}
	modelB := []seqKV{modelA[0].clone(), modelA[1].clone()}
	for layer := 0; layer < tLayers; layer++ {
		k, v := halves(r, 3*tDense), halves(r, 3*tDense)
		ok(t, cache.Write(WriteArgs{Layer: layer, Key: k, Value: v, SlotMapping: slotsB}))
		modelB[layer].push(k, v)
		k, v = halves(r, 2*tDense), halves(r, 2*tDense)
		ok(t, cache.Write(WriteArgs{Layer: layer, Key: k, Value: v, SlotMapping: slotsA2}))
		modelA[layer].push(k, v)
	}

	// The block table of the batch [A, B].
	table := must(cache.BlockTable([]SeqID{a, b}, 4))
	eq(t, "seq lens", fmt.Sprint(table.SeqLens), "[22 23]")
	tt := table.Table
	if int64(tt[0]) != slotsA[0]/tBlock || tt[4] != tt[0] || tt[5] == tt[1] || int64(tt[5]) != slotsB[0]/tBlock ||
		tt[2]|tt[3]|tt[6]|tt[7] != 0 {
		t.Fatalf("block table %v (A's slots %v, B's %v)", tt, slotsA, slotsB)
	}

	// Decode both layers: FP32 q/out with LSE, then FP16 q/out with options.
	dc := DecodeConfig{NumQueryHeads: tQHeads, MaxNumSeqs: 4, MaxContextLen: 64, MaxQueryLen: 1, QDType: FP32, OutDType: FP32}
	dec32 := must(cache.NewDecoder(dc))
	dc.QDType, dc.OutDType = FP16, FP16
	dec16 := must(cache.NewDecoder(dc))
	eq(t, "workspace", must(cache.DecodeWorkspaceSize(dc)), uint64(0))
	for layer := 0; layer < tLayers; layer++ {
		seqs := []*seqKV{&modelA[layer], &modelB[layer]}
		q := normals(r, 2*tQHeads*tD)
		out, lse := poison32(2*tQHeads*tD), poison32(2*tQHeads)
		ok(t, dec32.Decode(DecodeArgs{Layer: layer, Q: q, BlockTable: table.Table, BlockTableWidth: table.Width,
			SeqLens: table.SeqLens, Out: out, LSE: lse}))
		want, wantLSE := reference(toF64(q), seqs, refOptions{})
		what := fmt.Sprintf("layer %d FP32 decode", layer)
		expectClose(t, what, seed, out, want, math.Ldexp(1, -20), 1e-6)
		for i := range lse {
			if d := math.Abs(float64(lse[i]) - wantLSE[i]); !(d <= 1e-5*(1+math.Abs(wantLSE[i]))) {
				t.Fatalf("%s: lse %d = %v, reference %v (seed %d)", what, i, lse[i], wantLSE[i], seed)
			}
		}

		q16 := halves(r, 2*tQHeads*tD)
		opts := refOptions{smScale: float64(float32(0.1)), softCap: 5, window: 9, alibi: true}
		out16 := poison16(2 * tQHeads * tD)
		ok(t, dec16.Decode(DecodeArgs{Layer: layer, Q: q16, BlockTable: table.Table, BlockTableWidth: table.Width,
			SeqLens: table.SeqLens, SMScale: 0.1, LogitsSoftCap: 5, SlidingWindow: 9, ALiBiSlopes: alibiSlopes(),
			Out: out16}))
		want, _ = reference(toF64(q16), seqs, opts)
		expectClose(t, fmt.Sprintf("layer %d FP16 decode with options", layer), seed, out16, want, math.Ldexp(1, -10), 1e-6)
	}

	// Truncate B into its copied block, then decode B alone from a table
	// exported into a caller buffer with a row stride.
	ok(t, cache.Truncate(b, 18))
	eq(t, "free blocks after truncate", must(cache.NumFreeBlocks()), numBlocks-3)
	for i := range modelB {
		modelB[i].truncate(18)
	}
	tb := []int32{-7, -7, -7, -7, -7, -7}
	lens := []int32{-7}
	ok(t, cache.ExportBlockTable([]SeqID{b}, 3, 6, tb, lens))
	eq(t, "lens", lens[0], int32(18))
	eq(t, "past max_blocks_per_seq", fmt.Sprint(tb[3:]), "[-7 -7 -7]")
	q := normals(r, tQHeads*tD)
	out := poison32(tQHeads * tD)
	ok(t, dec32.Decode(DecodeArgs{Layer: 1, Q: q, BlockTable: tb[:3], BlockTableWidth: 3, SeqLens: lens, Out: out}))
	want, _ := reference(toF64(q), []*seqKV{&modelB[1]}, refOptions{})
	expectClose(t, "B after truncate", seed, out, want, math.Ldexp(1, -20), 1e-6)

	// Free: A's private block goes back, then B's two.
	ok(t, dec32.Close())
	ok(t, dec16.Close())
	ok(t, cache.FreeSeq(a))
	eq(t, "free blocks after freeing A", must(cache.NumFreeBlocks()), numBlocks-2)
	ok(t, cache.FreeSeq(b))
	eq(t, "free blocks after freeing B", must(cache.NumFreeBlocks()), numBlocks)

	// A freed id is an error naming it, never another sequence.
	_, err := cache.SeqLen(a)
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Message, "seq_id") ||
		!strings.Contains(e.Message, strconv.FormatInt(int64(a), 10)) {
		t.Fatalf("SeqLen of a freed sequence: %v", err)
	}
}

// ---------------------------------------------------------------------------
// INT8: the cache as stored, read through the public layout
// ---------------------------------------------------------------------------

func TestINT8AgainstStoredCache(t *testing.T) {
	r, seed := newRng(t)
	cfg := DefaultCacheConfig()
	cfg.NumBlocks, cfg.BlockSize, cfg.NumKVHeads, cfg.HeadSize, cfg.KDType, cfg.VDType = 8, tBlock, tKVHeads, tD, INT8, INT8
	cache := must(NewCache(cfg))
	defer cache.Close()
	lens := []int{11, 29}
	var seqs []SeqID
	var inputs []seqKV
	amaxK, amaxV := 0.0, 0.0
	for n, l := range lens {
		s := must(cache.CreateSeq())
		slots := must(cache.Append(s, l))
		k, v := normals(r, l*tDense), normals(r, l*tDense)
		if n == 1 {
			k[5*tDense+3] = float32(math.NaN()) // stored as 0 and counted
		}
		ok(t, cache.Write(WriteArgs{Key: k, Value: v, SlotMapping: slots}))
		if n == 1 {
			k[5*tDense+3] = 0
		}
		for i := range k {
			amaxK, amaxV = math.Max(amaxK, math.Abs(float64(k[i]))), math.Max(amaxV, math.Abs(float64(v[i])))
		}
		var m seqKV
		m.push(k, v)
		inputs, seqs = append(inputs, m), append(seqs, s)
	}
	st := must(cache.WriteStats())
	eq(t, "stats", fmt.Sprint(st.NonFinite, st.Saturated), "1 0")
	ok(t, cache.ResetWriteStats())
	eq(t, "stats after reset", must(cache.WriteStats()).NonFinite, uint64(0))

	table := must(cache.BlockTable(seqs, 2))
	dec := must(cache.NewDecoder(DecodeConfig{NumQueryHeads: tQHeads, MaxNumSeqs: 2, MaxContextLen: 32,
		MaxQueryLen: 1, QDType: FP32, OutDType: FP32}))
	defer dec.Close()
	q := normals(r, 2*tQHeads*tD)
	out := poison32(2 * tQHeads * tD)
	ok(t, dec.Decode(DecodeArgs{Q: q, BlockTable: table.Table, BlockTableWidth: 2, SeqLens: table.SeqLens, Out: out}))

	// Dequantize through the layout (header formulas); INT8 code * FP16 scale.
	l := must(cache.Layout(0))
	kd, vd := readHost(l.KData, l.KDataBytes), readHost(l.VData, l.VDataBytes)
	kscale, vscale := readHost(l.KScales, l.KScaleBytes), readHost(l.VScales, l.VScaleBytes)
	half := func(b []byte, off int64) float64 {
		return float64(Float16(uint16(b[off]) | uint16(b[off+1])<<8).Float32())
	}
	stored := make([]seqKV, 2)
	for s, n := range lens {
		for tok := 0; tok < n; tok++ {
			blk := int64(table.Table[s*2+tok/tBlock])
			off := int64(tok % tBlock)
			for h := int64(0); h < tKVHeads; h++ {
				ks := half(kscale, blk*l.KScaleBlockStride+h*l.KScaleHeadStride+off*int64(l.KScaleEntryBytes))
				vs := half(vscale, blk*l.VScaleBlockStride+h*l.VScaleHeadStride+off*int64(l.VScaleEntryBytes))
				for d := int64(0); d < tD; d++ {
					kc := int8(kd[blk*l.KBlockStride+h*l.KHeadStride+(d/int64(l.KX))*l.KChunkStride+off*16+d%int64(l.KX)])
					vc := int8(vd[blk*l.VBlockStride+h*l.VHeadStride+d*l.VChannelStride+off])
					stored[s].k = append(stored[s].k, float64(kc)*ks)
					stored[s].v = append(stored[s].v, float64(vc)*vs)
				}
			}
		}
	}
	runtime.KeepAlive(cache)
	want, _ := reference(toF64(q), []*seqKV{&stored[0], &stored[1]}, refOptions{})
	expectClose(t, "INT8 decode vs stored cache", seed, out, want, math.Ldexp(1, -20), 1e-6)
	kErr, vErr := amaxK/254*(1+math.Ldexp(1, -10)), amaxV/254*(1+math.Ldexp(1, -10))
	for s := range lens {
		for i := range stored[s].k {
			if math.Abs(stored[s].k[i]-inputs[s].k[i]) > kErr || math.Abs(stored[s].v[i]-inputs[s].v[i]) > vErr {
				t.Fatalf("element %d of seq %d: stored K/V %v/%v, inputs %v/%v (seed %d)", i, s,
					stored[s].k[i], stored[s].v[i], inputs[s].k[i], inputs[s].v[i], seed)
			}
		}
	}
}

// ---------------------------------------------------------------------------
// One cache from several goroutines
// ---------------------------------------------------------------------------

func TestConcurrentUseOfOneCache(t *testing.T) {
	r, seed := newRng(t)
	cfg := DefaultCacheConfig()
	cfg.NumBlocks, cfg.NumKVHeads, cfg.HeadSize, cfg.KDType, cfg.VDType = 96, tKVHeads, tD, FP16, FP16
	cache := must(NewCache(cfg))
	defer cache.Close()
	dc := DecodeConfig{NumQueryHeads: tQHeads, MaxNumSeqs: 1, MaxContextLen: 64, MaxQueryLen: 1, QDType: FP32, OutDType: FP32}
	shared := must(cache.NewDecoder(dc)) // Decode calls on it are serialized by the binding
	defer shared.Close()

	const workers, rounds = 8, 12
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int, rng *rand.Rand) {
			defer wg.Done()
			errs <- func() error {
				dec := shared
				if w%2 == 0 {
					own, err := cache.NewDecoder(dc)
					if err != nil {
						return err
					}
					defer own.Close()
					dec = own
				}
				for round := 0; round < rounds; round++ {
					s, err := cache.CreateSeq()
					if err != nil {
						return err
					}
					var model seqKV
					for chunk := 0; chunk < 3; chunk++ {
						n := 1 + rng.Intn(9)
						slots, err := cache.Append(s, n)
						if err != nil {
							return err
						}
						k, v := halves(rng, n*tDense), halves(rng, n*tDense)
						if err := cache.Write(WriteArgs{Key: k, Value: v, SlotMapping: slots}); err != nil {
							return err
						}
						model.push(k, v)
					}
					table, err := cache.BlockTable([]SeqID{s}, 4)
					if err != nil {
						return err
					}
					q := normals(rng, tQHeads*tD)
					out := poison32(tQHeads * tD)
					if err := dec.Decode(DecodeArgs{Q: q, BlockTable: table.Table, BlockTableWidth: 4,
						SeqLens: table.SeqLens, Out: out}); err != nil {
						return err
					}
					want, _ := reference(toF64(q), []*seqKV{&model}, refOptions{})
					for i := range out {
						if d := math.Abs(float64(out[i]) - want[i]); !(d <= 1e-6+math.Ldexp(1, -20)*math.Abs(want[i])) {
							return fmt.Errorf("goroutine %d round %d: element %d is %v, reference %v (seed %d)",
								w, round, i, out[i], want[i], seed)
						}
					}
					if err := cache.FreeSeq(s); err != nil {
						return err
					}
				}
				return nil
			}()
		}(w, rand.New(rand.NewSource(r.Int63())))
	}
	// Readers of the block manager meanwhile.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if n, err := cache.NumFreeBlocks(); err != nil || n < 0 || n > 96 {
				errs <- fmt.Errorf("NumFreeBlocks = %d, %v", n, err)
				return
			}
		}
		errs <- nil
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	eq(t, "free blocks at the end", must(cache.NumFreeBlocks()), 96)
}

// ---------------------------------------------------------------------------
// Handles: Close, finalizers, use after Close
// ---------------------------------------------------------------------------

func smallCache(t *testing.T) *Cache {
	cfg := DefaultCacheConfig()
	cfg.NumBlocks, cfg.NumKVHeads, cfg.HeadSize = 4, 1, 64
	return must(NewCache(cfg))
}

func TestCloseAndFinalizers(t *testing.T) {
	// A cache closed by Close is not finalized again; one dropped is.
	waitFinalized := func(before int64) bool {
		for i := 0; i < 50; i++ {
			runtime.GC()
			if atomic.LoadInt64(&finalizedCaches) > before {
				return true
			}
			time.Sleep(2 * time.Millisecond)
		}
		return false
	}
	before := atomic.LoadInt64(&finalizedCaches)
	func() { c := smallCache(t); ok(t, c.Close()); ok(t, c.Close()) }()
	if waitFinalized(before) {
		t.Fatal("a closed cache was finalized (Close must clear the finalizer)")
	}
	before = atomic.LoadInt64(&finalizedCaches)
	func() { _ = smallCache(t) }()
	if !waitFinalized(before) {
		t.Fatal("a dropped cache was not finalized")
	}
	// A dropped decoder lets its dropped cache be finalized after it.
	before = atomic.LoadInt64(&finalizedCaches)
	func() {
		c := smallCache(t)
		_ = must(c.NewDecoder(DecodeConfig{NumQueryHeads: 1, MaxNumSeqs: 1, MaxContextLen: 16, MaxQueryLen: 1,
			QDType: BF16, OutDType: BF16}))
	}()
	if !waitFinalized(before) {
		t.Fatal("a cache dropped with its decoder was not finalized")
	}

	// Close refuses while a decoder is open; calls after Close are errors.
	c := smallCache(t)
	d := must(c.NewDecoder(DecodeConfig{NumQueryHeads: 1, MaxNumSeqs: 1, MaxContextLen: 16, MaxQueryLen: 1,
		QDType: BF16, OutDType: BF16}))
	if err := c.Close(); !errors.Is(err, CodeInvalidArgument) || !strings.Contains(err.Error(), "decoder") {
		t.Fatalf("Close with an open decoder: %v", err)
	}
	ok(t, d.Close())
	ok(t, d.Close())
	if err := d.Decode(DecodeArgs{Q: []BFloat16{}, Out: []BFloat16{}, BlockTableWidth: 1}); err == nil ||
		!strings.Contains(err.Error(), "closed") {
		t.Fatalf("Decode after Close: %v", err)
	}
	ok(t, c.Close())
	if _, err := c.CreateSeq(); !errors.Is(err, CodeInvalidArgument) || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("CreateSeq after Close: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Errors and versions
// ---------------------------------------------------------------------------

func TestErrorsCarryCodeAndArgument(t *testing.T) {
	// From the library.
	cfg := DefaultCacheConfig()
	cfg.NumBlocks = 8 // NumKVHeads left 0
	_, err := NewCache(cfg)
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Message, "num_kv_heads") ||
		!strings.HasPrefix(err.Error(), "kvpage: INVALID_ARGUMENT: ") {
		t.Fatalf("NewCache without NumKVHeads: %v", err)
	}
	cfg.NumKVHeads, cfg.HeadSize = 1, 72
	if _, err := NewCache(cfg); err == nil || !strings.Contains(err.Error(), "head_size = 72") {
		t.Fatalf("NewCache with HeadSize 72: %v", err)
	}

	cache := smallCache(t)
	defer cache.Close()
	s := must(cache.CreateSeq())
	if _, err := cache.Append(s, 1000); !errors.Is(err, CodeOutOfBlocks) {
		t.Fatalf("Append of 1000 tokens: %v", err)
	}
	eq(t, "length after a failed append", must(cache.SeqLen(s)), 0)
	eq(t, "free blocks after a failed append", must(cache.NumFreeBlocks()), 4)
	if _, err := cache.ForkSeq(12345); err == nil || !strings.Contains(err.Error(), "12345") {
		t.Fatalf("ForkSeq(12345): %v", err)
	}

	// From the binding's own checks, with the same code.
	slots := must(cache.Append(s, 2))
	k := make([]BFloat16, 64) // one token, two slots
	if err := cache.Write(WriteArgs{Key: k, Value: k, SlotMapping: slots}); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "Key has 64 elements") {
		t.Fatalf("Write with a short Key: %v", err)
	}
	if err := cache.Write(WriteArgs{Key: []float64{1}, Value: k, SlotMapping: slots}); err == nil ||
		!strings.Contains(err.Error(), "Key is a []float64") {
		t.Fatalf("Write with []float64: %v", err)
	}
	dec := must(cache.NewDecoder(DecodeConfig{NumQueryHeads: 2, MaxNumSeqs: 1, MaxContextLen: 32, MaxQueryLen: 1,
		QDType: BF16, OutDType: BF16}))
	defer dec.Close()
	table := must(cache.BlockTable([]SeqID{s}, 2))
	if err := dec.Decode(DecodeArgs{Q: make([]float32, 128), Out: make([]BFloat16, 128), BlockTable: table.Table,
		BlockTableWidth: 2, SeqLens: table.SeqLens}); err == nil || !strings.Contains(err.Error(), "Q holds FP32") {
		t.Fatalf("Decode with FP32 Q on a BF16 decoder: %v", err)
	}
	if err := dec.Decode(DecodeArgs{Layer: 5, Q: make([]BFloat16, 128), Out: make([]BFloat16, 128),
		BlockTable: table.Table, BlockTableWidth: 2, SeqLens: table.SeqLens}); err == nil ||
		!strings.Contains(err.Error(), "layer = 5") {
		t.Fatalf("Decode of layer 5: %v", err)
	}
	if _, err := cache.NewDecoder(DecodeConfig{NumQueryHeads: 0, MaxNumSeqs: 1, MaxContextLen: 32, MaxQueryLen: 1,
		QDType: BF16, OutDType: BF16}); err == nil || !strings.Contains(err.Error(), "num_query_heads = 0") {
		t.Fatalf("NewDecoder with 0 query heads: %v", err)
	}
}

func TestCheckedModeReachesTheLibrary(t *testing.T) {
	if DefaultCacheConfig().Checked {
		t.Fatal("DefaultCacheConfig().Checked is true; the library's default is off")
	}
	cfg := DefaultCacheConfig()
	cfg.NumBlocks, cfg.NumKVHeads, cfg.HeadSize, cfg.Checked = 4, 1, 64, true
	c := must(NewCache(cfg))
	s := must(c.CreateSeq())
	eq(t, "slots of a checked cache", len(must(c.Append(s, 3))), 3)
	ok(t, c.Close())
	// The value arrives in kvp_cache_config.checked: the library refuses 2
	// and names the field.
	if _, err := newCache(cfg, 2); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "config->checked = 2") {
		t.Fatalf("newCache with checked = 2: %v", err)
	}
}

func TestPreciseModeReachesTheLibrary(t *testing.T) {
	if DefaultDecodeConfig().Precise {
		t.Fatal("DefaultDecodeConfig().Precise is true; the library's default is off")
	}
	c := smallCache(t)
	defer c.Close()
	cfg := DecodeConfig{NumQueryHeads: 2, MaxNumSeqs: 1, MaxContextLen: 32, MaxQueryLen: 1,
		QDType: FP32, OutDType: FP32, Precise: true}
	eq(t, "workspace of a precise decoder", must(c.DecodeWorkspaceSize(cfg)), uint64(0))
	dec := must(c.NewDecoder(cfg))
	eq(t, "Config().Precise", dec.Config().Precise, true)
	ok(t, dec.Close())
	// The value arrives in kvp_decode_config.precise: the library refuses 2
	// and names the field.
	if _, err := c.newDecoder(cfg, 0, 0, 2); !errors.Is(err, CodeInvalidArgument) ||
		!strings.Contains(err.Error(), "config->precise = 2") {
		t.Fatalf("newDecoder with precise = 2: %v", err)
	}
}

// A precise decoder on the CPU backend (precise in every mode) gives the
// default decoder's bits, and the reference's values.
func TestPreciseDecoderOnCPU(t *testing.T) {
	r, seed := newRng(t)
	for _, dt := range []DType{FP16, INT8} {
		cfg := DefaultCacheConfig()
		cfg.NumBlocks, cfg.NumKVHeads, cfg.HeadSize, cfg.KDType, cfg.VDType = 8, tKVHeads, tD, dt, dt
		cache := must(NewCache(cfg))
		seqs, models := writeSeqs(t, r, cache, []int{21, 6})
		table := must(cache.BlockTable(seqs, 2))
		dc := DecodeConfig{NumQueryHeads: tQHeads, MaxNumSeqs: 2, MaxContextLen: 32, MaxQueryLen: 1,
			QDType: FP32, OutDType: FP32}
		def := must(cache.NewDecoder(dc))
		dc.Precise = true
		prec := must(cache.NewDecoder(dc))
		q := normals(r, 2*tQHeads*tD)
		outs := [2][]float32{poison32(2 * tQHeads * tD), poison32(2 * tQHeads * tD)}
		lses := [2][]float32{poison32(2 * tQHeads), poison32(2 * tQHeads)}
		for i, d := range []*Decoder{def, prec} {
			ok(t, d.Decode(DecodeArgs{Q: q, BlockTable: table.Table, BlockTableWidth: 2,
				SeqLens: table.SeqLens, Out: outs[i], LSE: lses[i]}))
		}
		for i := range outs[0] {
			if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
				t.Fatalf("%v: out %d is %v precise, %v default (seed %d)", dt, i, outs[1][i], outs[0][i], seed)
			}
		}
		for i := range lses[0] {
			if math.Float32bits(lses[0][i]) != math.Float32bits(lses[1][i]) {
				t.Fatalf("%v: lse %d is %v precise, %v default (seed %d)", dt, i, lses[1][i], lses[0][i], seed)
			}
		}
		if dt == FP16 {
			want, _ := reference(toF64(q), models, refOptions{})
			expectClose(t, "precise FP16 decode", seed, outs[1], want, math.Ldexp(1, -20), 1e-6)
		}
		ok(t, def.Close())
		ok(t, prec.Close())
		ok(t, cache.Close())
	}
}

func TestVersionsAndConversions(t *testing.T) {
	eq(t, "Version", Version(), "0.1.0")
	if major, _ := ABIVersion(); major != 1 {
		t.Fatalf("ABI major %d", major)
	}
	if !strings.Contains(BuildInfo(), "backends=cpu") {
		t.Fatalf("BuildInfo %q", BuildInfo())
	}
	if n, err := CUDADeviceCount(); err != nil || n < 0 {
		t.Fatalf("CUDADeviceCount = %d, %v", n, err)
	}
	eq(t, "code name", CodeOutOfBlocks.String(), "OUT_OF_BLOCKS")
	eq(t, "unknown code name", ErrorCode(99).String(), "UNKNOWN")
	// Every FP16 and BF16 value round-trips; ties go to even.
	for bits := 0; bits <= 0xffff; bits++ {
		h := Float16(bits)
		if f := h.Float32(); f == f && Float16FromFloat32(f) != h {
			t.Fatalf("FP16 %#04x -> %v -> %#04x", bits, f, Float16FromFloat32(f))
		}
		b := BFloat16(bits)
		if f := b.Float32(); f == f && BFloat16FromFloat32(f) != b {
			t.Fatalf("BF16 %#04x -> %v -> %#04x", bits, f, BFloat16FromFloat32(f))
		}
	}
	eq(t, "1+2^-11", Float16FromFloat32(1+1.0/2048), Float16(0x3c00))
	eq(t, "1+3*2^-11", Float16FromFloat32(1+3.0/2048), Float16(0x3c02))
	eq(t, "65520", Float16FromFloat32(65520), Float16(0x7c00))
	eq(t, "65519", Float16FromFloat32(65519), Float16(0x7bff))
	eq(t, "2^-25", Float16FromFloat32(float32(math.Ldexp(1, -25))), Float16(0))
	eq(t, "bf16 tie", BFloat16FromFloat32(math.Float32frombits(0x3f808000)), BFloat16(0x3f80))
	eq(t, "bf16 tie up", BFloat16FromFloat32(math.Float32frombits(0x3f818000)), BFloat16(0x3f82))
}
