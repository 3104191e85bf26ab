package comm_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gccl/gccl/comm"
)

// The README's example: four ranks in one process average a gradient.
func Example() {
	ranks, _ := comm.InitLocal(4, nil) // 4 ranks in this process
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Add(1)
		go func() { // one goroutine per rank
			defer wg.Done()
			grad := []float32{float32(c.Rank()), 1}
			_ = comm.AllReduce(context.Background(), c, grad, grad, comm.Avg) // grad == [1.5 1]
			if c.Rank() == 0 {
				fmt.Println(grad)
			}
		}()
	}
	wg.Wait()
	for _, c := range ranks {
		c.Close()
	}
	// Output: [1.5 1]
}

// A ring exchange with a group call: every rank sends to its right
// neighbour and receives from its left one in a single step.
func ExampleComm_Group() {
	ranks, _ := comm.InitLocal(3, nil)
	got := make([][]int32, 3)
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, r := c.Size(), c.Rank()
			out, in := []int32{int32(r)}, []int32{-1}
			_ = c.Group(context.Background(), comm.SendTo((r+1)%n, out), comm.RecvFrom((r+n-1)%n, in))
			got[r] = in
		}()
	}
	wg.Wait()
	fmt.Println(got)
	// Output: [[2] [0] [1]]
}
