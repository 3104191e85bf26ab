// Command determcheck is one rank of a multi-process check of the
// deterministic contract (comm.Config.Deterministic): it joins the job
// from the environment (as launched by gccl-run, with
// GCCL_DETERMINISTIC=1), runs commtest.CheckDeterministic (AllReduce,
// ReduceScatter and Reduce of float32, float64, bfloat16 and float16
// inputs, Sum, Avg and PreMulSum, in place or not, at many lengths and
// offsets) and compares every element's bits with the rank-order fold.
// It prints "determcheck: rank R of N ok" and exits 0, or prints the first
// difference or error and exits 1. Run it with GCCL_SLOT_SIZE set to the
// -slot flag, so that the lengths cross the chunks.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/commtest"
)

func main() {
	slot := flag.Int("slot", 1024, "the transport's slot size in bytes (GCCL_SLOT_SIZE)")
	limit := flag.Int("limit", 1<<12, "about the largest element count")
	timeout := flag.Duration("timeout", 2*time.Minute, "whole-run deadline")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := comm.Init(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "determcheck: init: %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	if !c.Deterministic() {
		fmt.Fprintf(os.Stderr, "determcheck: rank %d: not deterministic (set GCCL_DETERMINISTIC=1)\n", c.Rank())
		os.Exit(1)
	}
	opts := commtest.DetermOptions{Sizes: commtest.DetermSizes(c, *slot, *limit)}
	if err := commtest.CheckDeterministic(ctx, c, opts); err != nil {
		fmt.Fprintf(os.Stderr, "determcheck: rank %d: %v\n", c.Rank(), err)
		os.Exit(1)
	}
	fmt.Printf("determcheck: rank %d of %d ok\n", c.Rank(), c.Size())
}
