package comm_test

import (
	"errors"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/p2p"
	"github.com/gccl/gccl/topo"
	"github.com/gccl/gccl/transport/shm"
)

// Every "hardware or feature absent" error gccl returns is comm's
// ErrNotSupported in errors.Is, whichever package returned it: the check
// the README promises a user.
func TestNotSupportedIsOneError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.so")
	t.Setenv("GCCL_CUDA_LIBRARY", missing)
	t.Setenv("GCCL_NVML_LIBRARY", missing)

	_, err := gpu.Open(0)
	require.Error(t, err, "gpu.Open without a CUDA driver")
	require.ErrorIs(t, err, comm.ErrNotSupported, "gpu.Open: %v", err)
	require.ErrorIs(t, err, gpu.ErrNotSupported)

	a, err := p2p.New("notsupported", p2p.Config{})
	require.NoError(t, err)
	defer a.Close()
	_, err = a.RegisterVRAM(1<<20, 4096, 0)
	require.Error(t, err, "p2p VRAM registration without a CUDA driver")
	require.ErrorIs(t, err, comm.ErrNotSupported, "RegisterVRAM: %v", err)
	require.ErrorIs(t, err, p2p.ErrNotSupported)

	_, err = topo.NewNVMLSource()
	require.Error(t, err, "topology's GPU listing without NVML")
	require.ErrorIs(t, err, comm.ErrNotSupported, "NVML: %v", err)
	require.ErrorIs(t, err, topo.ErrNotSupported)
	if runtime.GOOS != "linux" {
		_, err = topo.Detector{}.Detect()
		require.ErrorIs(t, err, comm.ErrNotSupported, "topology detection: %v", err)
	}

	for _, e := range []error{shm.ErrNotSupported, topo.ErrNotSupported, p2p.ErrNotSupported, gpu.ErrNotSupported} {
		require.ErrorIs(t, e, comm.ErrNotSupported, "%v", e)
		require.ErrorIs(t, comm.ErrNotSupported, e, "%v", e)
	}
	// Only its own kind.
	require.False(t, errors.Is(comm.ErrClosed, comm.ErrNotSupported))
	require.ErrorIs(t, p2p.ErrClosed, comm.ErrClosed)
	require.ErrorIs(t, p2p.ErrTimeout, comm.ErrTimeout)
	require.ErrorIs(t, p2p.ErrInvalidArgument, comm.ErrInvalidArgument)
}
