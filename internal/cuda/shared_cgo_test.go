//go:build linux && cgo

package cuda

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func openShared(t *testing.T) *Shared {
	t.Helper()
	s, err := OpenShared()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// Two references share the driver, each device's context and the values
// kept with it; the last one to close releases them, and the next
// OpenShared starts afresh.
func TestSharedDriverAndContexts(t *testing.T) {
	fakeDriver(t)
	a, b := openShared(t), openShared(t)
	require.Same(t, a.Driver(), b.Driver())
	require.Equal(t, 2, a.DeviceCount())
	ca, err := a.Context(1)
	require.NoError(t, err)
	cb, err := b.Context(1)
	require.NoError(t, err)
	require.Same(t, ca, cb, "one context per device in the process")
	c0, err := a.Context(0)
	require.NoError(t, err)
	require.NotSame(t, ca, c0)
	_, err = a.Context(2)
	require.ErrorContains(t, err, "device 2 does not exist (this process sees 2)")

	bus, err := a.PCIBusID(1)
	require.NoError(t, err)
	require.Equal(t, "0000:3c:00.0", bus)
	require.Equal(t, 1, b.DeviceOfBus(bus))
	require.Equal(t, -1, b.DeviceOfBus("0000:ff:00.0"))
	require.Equal(t, -1, b.DeviceOfBus(""))

	type key struct{}
	made := 0
	mk := func() any { made++; return new(int) }
	va, err := a.Value(1, key{}, mk)
	require.NoError(t, err)
	vb, err := b.Value(1, key{}, mk)
	require.NoError(t, err)
	require.Same(t, va, vb)
	require.Equal(t, 1, made, "the value is made once per context")

	drv := a.Driver()
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "a second Close")
	_, err = a.Context(1)
	require.ErrorIs(t, err, ErrClosed)
	_, err = a.Import(1, IPCHandle{})
	require.ErrorIs(t, err, ErrClosed)
	p, err := cb.Alloc(4096) // b still holds the context
	require.NoError(t, err)
	require.NoError(t, cb.Free(p))

	require.NoError(t, b.Close())
	_, err = drv.DeviceCount()
	require.ErrorIs(t, err, ErrClosed, "the last Close closes the driver")
	c := openShared(t)
	require.NotSame(t, drv, c.Driver(), "a new reference loads the driver again")
	vc, err := c.Value(1, key{}, mk)
	require.NoError(t, err)
	require.NotSame(t, va, vc, "values go with the released context")
}

// Without a driver OpenShared fails as Load does, and a failure is not
// remembered.
func TestSharedWithoutDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
	_, err := OpenShared()
	require.ErrorIs(t, err, ErrNotSupported)
	fakeDriver(t)
	s, err := OpenShared()
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

// Imports of one handle, by one or several references, share one mapping,
// unmapped by the last Close, or by the end of the last deferral of the
// context's closes; Shared.Close closes what its reference left open. The
// handle is exported by this process and imported in a child (the driver
// refuses a process its own handles).
func TestSharedImports(t *testing.T) {
	if hs := os.Getenv("GCCL_TEST_SHARED_IMPORT"); hs != "" {
		sharedImportChild(t, hs)
		return
	}
	fakeDriver(t)
	_, ctx := device0(t)
	p, err := ctx.Alloc(1 << 20)
	require.NoError(t, err)
	defer ctx.Free(p)
	require.NoError(t, ctx.CopyToDevice(p+4096, []byte("shared import")))
	h, err := ctx.IPCHandle(p)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedImports$", "-test.v")
	cmd.Env = append(os.Environ(), "GCCL_TEST_SHARED_IMPORT="+hex.EncodeToString(h[:]))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS")
}

func sharedImportChild(t *testing.T, hs string) {
	var h IPCHandle
	b, err := hex.DecodeString(hs)
	require.NoError(t, err)
	copy(h[:], b)
	maps := func() int {
		b, err := os.ReadFile("/proc/self/maps")
		require.NoError(t, err)
		return strings.Count(string(b), "memfd:fakecuda")
	}
	read := func(imp *Import) string {
		got := make([]byte, 13)
		require.NoError(t, imp.Context().CopyFromDevice(got, imp.Base()+4096))
		return string(got)
	}
	before := maps()
	s1, s2 := openShared(t), openShared(t)
	i1, err := s1.Import(0, h)
	require.NoError(t, err)
	i2, err := s2.Import(0, h)
	require.NoError(t, err)
	i3, err := s2.Import(0, h)
	require.NoError(t, err)
	require.Equal(t, i1.Base(), i2.Base())
	require.Equal(t, i1.Base(), i3.Base())
	require.Equal(t, 1<<20, i1.Size())
	require.Equal(t, 0, i1.Ordinal())
	require.Equal(t, before+1, maps(), "one mapping for three imports")
	require.Equal(t, "shared import", read(i2))

	require.NoError(t, i1.Close())
	require.NoError(t, i1.Close(), "a second Close")
	require.NoError(t, i2.Close())
	require.Equal(t, before+1, maps(), "i3 still holds the mapping")
	require.Equal(t, "shared import", read(i3))

	// Deferred: the last Close leaves the mapping until the deferral ends.
	end1, err := s1.DeferCloses(0)
	require.NoError(t, err)
	end2, err := s2.DeferCloses(0)
	require.NoError(t, err)
	require.NoError(t, i3.Close())
	require.Equal(t, before+1, maps(), "unmapped while closes are deferred")
	require.NoError(t, end1())
	require.Equal(t, before+1, maps(), "unmapped before the last deferral ended")
	require.NoError(t, end1(), "a second end")
	require.NoError(t, end2())
	require.Equal(t, before, maps(), "not unmapped when the last deferral ended")

	// Opened again after the last close; Shared.Close closes what is left.
	i4, err := s1.Import(0, h)
	require.NoError(t, err)
	require.Equal(t, before+1, maps())
	require.NoError(t, s1.Close())
	require.Equal(t, before, maps(), "Shared.Close left an import mapped")
	require.NoError(t, i4.Close(), "Close of an import its reference closed")

	var ce *Error
	_, err = s2.Import(0, IPCHandle{})
	require.True(t, errors.As(err, &ce), "a bad handle: %v", err)
	fmt.Println("child done")
}
