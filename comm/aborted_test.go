package comm_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/gccl/gccl/comm"
)

// TestOperationOverlappingAbortFails: an operation during which the Comm
// aborted fails with ErrAborted rather than return its result. Abort
// replaces the shared-memory slots with zero pages, so what the operation
// read from them may be zeros (tests.TestShrinkUnderGcclRun once saw a
// Broadcast return nil with its output zero from element 20 on, after the
// heartbeat aborted the Comm for a killed peer). Both the collective path
// and the Group fast path are checked.
func TestOperationOverlappingAbortFails(t *testing.T) {
	for _, kind := range []string{"AllReduce", "Send/Recv"} {
		t.Run(kind, func(t *testing.T) {
			cs, stop := initJobOver(t, 2)
			defer stop()
			defer closeAll(cs)
			victim := cs[0]
			var once sync.Once
			comm.SetRanHook(func(c *comm.Comm) {
				if c == victim {
					once.Do(func() { c.Abort(errors.New("test: the Comm aborts as the operation ends")) })
				}
			})
			defer comm.SetRanHook(nil)
			ctx := context.Background()
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					b := []int64{1, 2, 3, int64(r)}
					switch kind {
					case "AllReduce":
						errs[r] = comm.AllReduce(ctx, cs[r], b, b, comm.Sum)
					case "Send/Recv":
						if r == 0 {
							errs[r] = comm.Recv(ctx, cs[r], b, 1)
						} else {
							errs[r] = comm.Send(ctx, cs[r], b, 0)
						}
					}
				}()
			}
			wg.Wait()
			if !errors.Is(errs[0], comm.ErrAborted) {
				t.Fatalf("rank 0's %s, aborted as it ended: %v, want ErrAborted", kind, errs[0])
			}
		})
	}
}
