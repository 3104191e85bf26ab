package comm_test

import (
	"errors"
	"path/filepath"
	"runtime"
	"testing"

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

	notSupported := func(what string, err error, pkgErr error) {
		t.Helper()
		if !errors.Is(err, comm.ErrNotSupported) || !errors.Is(err, pkgErr) {
			t.Errorf("%s: %v, want comm.ErrNotSupported and its package's", what, err)
		}
	}
	_, err := gpu.Open(0)
	notSupported("gpu.Open without a CUDA driver", err, gpu.ErrNotSupported)

	a, err := p2p.New("notsupported", p2p.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = a.RegisterVRAM(1<<20, 4096, 0)
	notSupported("p2p VRAM registration without a CUDA driver", err, p2p.ErrNotSupported)

	_, err = topo.NewNVMLSource()
	notSupported("topology's GPU listing without NVML", err, topo.ErrNotSupported)
	if runtime.GOOS != "linux" {
		_, err = topo.Detector{}.Detect()
		notSupported("topology detection", err, topo.ErrNotSupported)
	}

	for _, e := range []error{shm.ErrNotSupported, topo.ErrNotSupported, p2p.ErrNotSupported, gpu.ErrNotSupported} {
		if !errors.Is(e, comm.ErrNotSupported) || !errors.Is(comm.ErrNotSupported, e) {
			t.Errorf("%v and comm.ErrNotSupported are not one error", e)
		}
	}
	// Only its own kind.
	if errors.Is(comm.ErrClosed, comm.ErrNotSupported) {
		t.Error("ErrClosed is ErrNotSupported")
	}
	for _, c := range []struct{ e, kind error }{
		{p2p.ErrClosed, comm.ErrClosed}, {p2p.ErrTimeout, comm.ErrTimeout}, {p2p.ErrInvalidArgument, comm.ErrInvalidArgument},
	} {
		if !errors.Is(c.e, c.kind) {
			t.Errorf("%v is not %v", c.e, c.kind)
		}
	}
}
