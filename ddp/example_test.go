package ddp_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/ddp"
)

// Two ranks average the gradients of two parameters, a weight of 3
// elements and a bias of 2, marked ready as a backward pass produces them.
func Example() {
	ranks, _ := comm.InitLocal(2, nil)
	sizes := []int{3, 2}
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Go(func() {
			ctx := context.Background()
			red, err := ddp.New(ctx, c, sizes, nil) // collective
			if err != nil {
				panic(err)
			}
			defer red.Close()
			for i := len(sizes) - 1; i >= 0; i-- { // the backward pass
				g := red.Grad(i) // rank 0: 1 2 3, rank 1: 2 4 6
				for j := range g {
					g[j] = float32((c.Rank() + 1) * (j + 1))
				}
				if err := red.MarkReady(i); err != nil {
					panic(err)
				}
			}
			if err := red.Wait(ctx); err != nil {
				panic(err)
			}
			if c.Rank() == 0 {
				fmt.Println(red.Grad(0), red.Grad(1))
			}
		})
	}
	wg.Wait()
	for _, c := range ranks {
		c.Close()
	}
	// Output: [1.5 3 4.5] [1.5 3]
}
