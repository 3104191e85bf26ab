//go:build linux

package comm

import (
	"context"
	"testing"
	"time"

	"github.com/gccl/gccl/device/devicetest"
)

// TestStragglersDeviceStaging: a device collective that the ranks agree
// at arrival to run through host staging is logged at that arrival, when
// the others waited for the late rank, not after it, when all ranks are
// together again.
func TestStragglersDeviceStaging(t *testing.T) {
	const n, late, sleep = 3, 2, 100 * time.Millisecond
	var bufs [n]*devicetest.Buffer
	for r := range bufs {
		// Rank 0 cannot export its memory: every rank stages.
		bufs[r] = newFakeDevBuf(t, 64, &devicetest.Engine{EngineName: "fake", FailExport: r == 0})
	}
	var reports [n][]Straggle
	errs := runFakeRanks(t, n, func(c *Comm) error {
		if c.Rank() == late {
			time.Sleep(sleep)
		}
		if err := c.AllReduce(context.Background(), bufs[c.Rank()], bufs[c.Rank()], Sum); err != nil {
			return err
		}
		var err error
		reports[c.Rank()], err = c.Stragglers(context.Background())
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, rep := range reports {
		if len(rep) != 1 || rep[0].Last != late || rep[0].Late < sleep/2 {
			t.Errorf("rank %d: report %+v; want the all-reduce with rank %d last, at least %v late", r, rep, late, sleep/2)
		}
	}
}
