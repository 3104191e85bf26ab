package comm_test

import (
	"testing"

	"github.com/gccl/gccl/comm"
)

// TestCostlyPollFollowsTheTransport: ranks of one host that talk over TCP
// poll with a system call, and their waits say so (a crowded waiter then
// yields sooner); over shared memory they poll memory.
func TestCostlyPollFollowsTheTransport(t *testing.T) {
	for _, tc := range []struct {
		name string
		shm  string
		want bool
	}{{"tcp", "1", true}, {"shm", "0", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GCCL_SHM_DISABLE", tc.shm)
			cs, stop := initJobOver(t, 2)
			defer stop()
			defer closeAll(cs)
			for r, c := range cs {
				if got := comm.CostlyPoll(c); got != tc.want {
					t.Errorf("rank %d over %s: CostlyPoll = %v, want %v", r, tc.name, got, tc.want)
				}
			}
		})
	}
}
