// SPDX-License-Identifier: Apache-2.0

package kvpage_test

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"kvpage"
)

// A CPU cache with INT8 keys and values, one sequence of three tokens, and a
// decode of one query token per head.
func Example() {
	cfg := kvpage.DefaultCacheConfig()
	cfg.NumBlocks, cfg.NumKVHeads, cfg.HeadSize = 32, 2, 64
	cfg.KDType, cfg.VDType = kvpage.INT8, kvpage.INT8
	cache, err := kvpage.NewCache(cfg)
	if err != nil {
		panic(err)
	}
	defer cache.Close()

	seq, _ := cache.CreateSeq()
	slots, _ := cache.Append(seq, 3) // where the 3 new tokens go
	k := make([]float32, 3*2*64)
	v := make([]float32, 3*2*64)
	for i := range k {
		k[i], v[i] = float32(math.Sin(float64(i)*0.37)), float32(math.Cos(float64(i)*0.11))
	}
	if err := cache.Write(kvpage.WriteArgs{Layer: 0, Key: k, Value: v, SlotMapping: slots}); err != nil {
		panic(err)
	}

	dec, err := cache.NewDecoder(kvpage.DecodeConfig{NumQueryHeads: 4, MaxNumSeqs: 8, MaxContextLen: 512,
		MaxQueryLen: 1, QDType: kvpage.FP32, OutDType: kvpage.FP32})
	if err != nil {
		panic(err)
	}
	defer dec.Close()
	table, _ := cache.BlockTable([]kvpage.SeqID{seq}, 32)
	q := make([]float32, 4*64)
	out := make([]float32, 4*64)
	for i := range q {
		q[i] = 0.25
	}
	err = dec.Decode(kvpage.DecodeArgs{Q: q, BlockTable: table.Table, BlockTableWidth: table.Width,
		SeqLens: table.SeqLens, Out: out})
	fmt.Println(err, table.SeqLens, math.Abs(float64(out[0])) <= 1)

	// Errors carry the library's code and a message naming the argument.
	err = cache.Truncate(seq, 10)
	var e *kvpage.Error
	fmt.Println(errors.Is(err, kvpage.CodeInvalidArgument), errors.As(err, &e) && strings.Contains(e.Message, "length"))
	// Output:
	// <nil> [3] true
	// true true
}
