// SPDX-License-Identifier: Apache-2.0

// Cache.Pack / Cache.Unpack and the format signature (ABI 1.4) on the CPU
// backend: a sequence packed layer by layer and unpacked into a cache of
// another size, at the blocks that cache's own sequence got, packs back to
// the same bytes and decodes to the same bits; a cache of another format
// refuses the buffer through its signature, naming the field.
package kvpage

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

func packCache(t *testing.T, numBlocks int, k DType) *Cache {
	cfg := DefaultCacheConfig()
	cfg.NumLayers, cfg.NumBlocks, cfg.BlockSize, cfg.NumKVHeads, cfg.HeadSize = 3, numBlocks, 8, tKVHeads, tD
	cfg.KDType, cfg.VDType = k, INT4
	return must(NewCache(cfg))
}

func TestPackUnpackRoundTrip(t *testing.T) {
	r, seed := newRng(t)
	src, dst := packCache(t, 16, INT8), packCache(t, 24, INT8)
	defer src.Close()
	defer dst.Close()
	n := 3*8 + 5
	seq := must(src.CreateSeq())
	slots := must(src.Append(seq, n))
	for layer := 0; layer < 3; layer++ {
		ok(t, src.Write(WriteArgs{Layer: layer, Key: halves(r, n*tDense), Value: halves(r, n*tDense),
			SlotMapping: slots}))
	}
	must(dst.Append(must(dst.CreateSeq()), 16)) // the receiver's ids differ
	moved := must(dst.CreateSeq())
	must(dst.Append(moved, n))
	from := must(src.BlockTable([]SeqID{seq}, 4))
	to := must(dst.BlockTable([]SeqID{moved}, 4))
	if from.Table[0] == to.Table[0] {
		t.Fatalf("the two caches gave the same block ids %v", from.Table)
	}
	sig := must(src.FormatSignature())
	ok(t, dst.CheckSignature(sig))
	layerBytes := int(must(src.PackSize(len(from.Table), 1)))
	whole := NewPackBuffer(int(must(src.PackSize(len(from.Table), 0))))
	ok(t, src.Pack(from.Table, whole, PackOptions{}))
	part := NewPackBuffer(layerBytes)
	for layer := 0; layer < 3; layer++ {
		o := PackOptions{FirstLayer: layer, NumLayers: 1, Signature: sig}
		ok(t, src.Pack(from.Table, part, o))
		if !bytes.Equal(part, whole[layer*layerBytes:(layer+1)*layerBytes]) {
			t.Fatalf("seed %d: layer %d's pack is not its slice of the whole", seed, layer)
		}
		ok(t, dst.Unpack(to.Table, part, o))
	}
	again := NewPackBuffer(len(whole))
	ok(t, dst.Pack(to.Table, again, PackOptions{}))
	if !bytes.Equal(again, whole) {
		t.Fatalf("seed %d: packed back, the bytes differ", seed)
	}

	cfg := DecodeConfig{NumQueryHeads: tQHeads, MaxNumSeqs: 1, MaxContextLen: 32, MaxQueryLen: 1, QDType: FP32,
		OutDType: FP32}
	q := make([]float32, tQHeads*tD)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	for layer := 0; layer < 3; layer++ {
		var outs [2][]float32
		for i, side := range []struct {
			c *Cache
			b *BlockTable
		}{{src, from}, {dst, to}} {
			dec := must(side.c.NewDecoder(cfg))
			outs[i] = poison32(len(q))
			ok(t, dec.Decode(DecodeArgs{Layer: layer, Q: q, BlockTable: side.b.Table, BlockTableWidth: 4,
				SeqLens: side.b.SeqLens, Out: outs[i]}))
			ok(t, dec.Close())
		}
		for i := range q {
			if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
				t.Fatalf("seed %d: layer %d element %d decodes to %v after the move, %v before", seed,
					layer, i, outs[1][i], outs[0][i])
			}
		}
	}

	// Another format: refused before anything moves, naming the field.
	fp8 := packCache(t, 16, FP8E4M3)
	defer fp8.Close()
	fp8Sig := must(fp8.FormatSignature())
	err := dst.CheckSignature(fp8Sig)
	var kerr *Error
	if !errors.As(err, &kerr) || kerr.Code != CodeInvalidArgument ||
		!strings.Contains(kerr.Message, "k_dtype is FP8 (3) in the signature, INT8 (4)") {
		t.Fatalf("CheckSignature of an FP8 cache: %v", err)
	}
	if err := dst.Unpack(to.Table, whole, PackOptions{Signature: fp8Sig}); err == nil {
		t.Fatal("Unpack with another format's signature succeeded")
	}
	ok(t, dst.Pack(to.Table, again, PackOptions{}))
	if !bytes.Equal(again, whole) {
		t.Fatal("a refused Unpack changed the cache")
	}
}

func TestPackBadArguments(t *testing.T) {
	c := packCache(t, 8, BF16)
	defer c.Close()
	buf := NewPackBuffer(int(must(c.PackSize(2, 0))))
	for _, tc := range []struct {
		err  error
		want string
	}{
		{c.Unpack([]int32{3, 3}, buf, PackOptions{}), "block_ids[1] = 3"},
		{c.Pack([]int32{0, 8}, buf, PackOptions{}), "block_ids[1] = 8"},
		{c.Pack([]int32{0, 1, 2}, buf, PackOptions{}), "buffer_bytes"},
		{c.Pack([]int32{0}, buf[1:], PackOptions{}), "aligned"},
		{c.Pack([]int32{0}, buf, PackOptions{FirstLayer: 3}), "first_layer"},
		{c.Pack([]int32{0}, buf, PackOptions{Signature: []byte{1, 2}}), "Signature has 2 bytes"},
		{c.CheckSignature(make([]byte, 64)), "magic"},
	} {
		var kerr *Error
		if !errors.As(tc.err, &kerr) || kerr.Code != CodeInvalidArgument || !strings.Contains(kerr.Message, tc.want) {
			t.Errorf("want an invalid-argument error naming %q, got %v", tc.want, tc.err)
		}
	}
	if _, err := c.PackSize(1, 4); err == nil {
		t.Error("PackSize of 4 layers of a 3-layer cache succeeded")
	}
}
