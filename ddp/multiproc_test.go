package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/ddp"
	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/testutil"
)

// helperEnv, set in a rank's environment, makes the test binary run one
// rank of TestAcrossProcesses in that mode instead of the tests.
const helperEnv = "GCCL_DDP_TEST_HELPER"

// Ranks in separate processes, over shared memory (where symmetric buckets
// are mapped by every peer) and over TCP.
func TestAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		mode string
		np   int
		env  []string
	}{
		{"avg", 2, nil},
		{"sym", 3, nil},
		{"bf16", 2, nil},
		{"sym", 2, []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}},
		{"missing", 3, nil},
	} {
		t.Run(fmt.Sprintf("%s/np=%d/tcp=%v", tc.mode, tc.np, tc.env != nil), func(t *testing.T) {
			var out testutil.SyncBuffer
			job := &launch.Job{
				NProcs:    tc.np,
				Argv:      []string{os.Args[0], "-test.run=^$"},
				Env:       append(append(testutil.EnvWithoutJob(), helperEnv+"="+tc.mode), tc.env...),
				TagOutput: true,
				Stdout:    &out,
				Stderr:    &out,
				ShmDir:    t.TempDir(),
				Timeout:   2 * time.Minute,
			}
			code, err := job.Run(context.Background())
			require.NoError(t, err, out.String())
			require.Zero(t, code, out.String())
			for r := range tc.np {
				require.Contains(t, out.String(), fmt.Sprintf("ddp-helper: rank %d of %d ok", r, tc.np))
			}
		})
	}
}

// helperRank is one rank of TestAcrossProcesses: a few steps of synthetic
// gradients, checked against the average every rank can work out.
func helperRank(mode string) int {
	if err := helperSteps(mode); err != nil {
		fmt.Fprintln(os.Stderr, "ddp-helper:", err)
		return 1
	}
	return 0
}

func helperSteps(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := comm.Init(ctx, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	sizes := []int{70_000, 5, 20_000, 300}
	cfg := &ddp.Config{FirstBucketBytes: 1000, BucketBytes: 100_000}
	switch mode {
	case "sym":
		cfg.Symmetric = true
	case "bf16":
		cfg.Compression = ddp.BFloat16
	}
	r, err := ddp.New(ctx, c, sizes, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	n, rank := c.Size(), c.Rank()
	for s := range 4 {
		for _, i := range order(len(sizes), rank, s) {
			if mode == "missing" && s == 1 && rank == 1 && i == 2 {
				continue
			}
			fill(r.Grad(i), rank, s, i)
			if err := r.MarkReady(i); err != nil {
				return err
			}
		}
		err := r.Wait(ctx)
		if mode == "missing" && s == 1 {
			if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "rank 1 did not mark parameter 2 ready") {
				return fmt.Errorf("step 1 with a missed parameter: %v, want ErrMismatch naming rank 1 and parameter 2", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		tol := 0.0
		if n&(n-1) != 0 {
			tol = 1e-6 // the average premultiplies by 1/n, inexact
		}
		if cfg.Compression == ddp.BFloat16 {
			tol = 2.0 / 64
		}
		for i := range sizes {
			for j, v := range r.Grad(i) {
				if w := want(n, s, i, j, 0); v != float32(w) && (tol == 0 || abs(float64(v)-w) > tol) {
					return fmt.Errorf("step %d parameter %d element %d: %v, want %v", s, i, j, v, w)
				}
			}
		}
		grads := make([][]float32, len(sizes))
		for i := range sizes {
			grads[i] = r.Grad(i)
		}
		if err := r.CheckReplicas(ctx, grads); err != nil {
			return err
		}
	}
	fmt.Printf("ddp-helper: rank %d of %d ok (%s)\n", rank, n, mode)
	return nil
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
