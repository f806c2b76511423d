// SPDX-License-Identifier: Apache-2.0

// Command kvpageconsumer builds against an installed kvpage through
// pkg-config and runs without LD_LIBRARY_PATH: the rpath comes from the
// Libs of kvpage.pc.
package main

import (
	"fmt"
	"os"

	"kvpage"
)

func main() {
	cfg := kvpage.DefaultCacheConfig()
	cfg.NumBlocks, cfg.NumKVHeads, cfg.HeadSize = 8, 1, 64
	cache, err := kvpage.NewCache(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cache.Close()
	if _, err := cache.CreateSeq(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("go consumer: kvpage", kvpage.Version())
}
