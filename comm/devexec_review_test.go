//go:build linux

package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// fakeEngine is a DeviceEngine over host memory: "device addresses" are
// addresses of Go memory, descriptions carry them, and the work runs at
// once. Float32 Sum only.
type fakeEngine struct {
	name       string
	failImport bool
	failExport bool
	waitDelay  time.Duration
	waits      *atomic.Int64 // Wait calls completed
}

func (e *fakeEngine) Name() string { return e.name }
func (e *fakeEngine) Ready() error { return nil }
func (e *fakeEngine) AppendExport(dst []byte, ptr uintptr, n int) ([]byte, error) {
	if e.failExport {
		return nil, errors.New("fake engine: memory of another allocator, no IPC handle")
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ptr))
	return binary.LittleEndian.AppendUint64(dst, uint64(n)), nil
}
func (e *fakeEngine) Import(desc []byte, n int) (uintptr, error) {
	if e.failImport {
		return 0, errors.New("fake engine: cannot map the peer's memory")
	}
	return uintptr(binary.LittleEndian.Uint64(desc)), nil
}
func (e *fakeEngine) Reduce(r *DeviceReduce) error {
	for i := 0; i < r.Count; i++ {
		s := float32(0)
		for _, p := range r.In {
			s += *(*float32)(unsafe.Add(unsafe.Pointer(nil), p+uintptr(4*i)))
		}
		for _, p := range r.Out {
			*(*float32)(unsafe.Add(unsafe.Pointer(nil), p+uintptr(4*i))) = s
		}
	}
	return nil
}
func (e *fakeEngine) Copy(dst, src uintptr, n int) error {
	copy(deviceBytes(dst, n), deviceBytes(src, n))
	return nil
}
func (e *fakeEngine) Wait() error {
	time.Sleep(e.waitDelay)
	if e.waits != nil {
		e.waits.Add(1)
	}
	return nil
}

// fakeDevBuf is a PeerDeviceBuffer of float32 in memory outside the Go
// heap (as device memory is: checkptr rejects device views of Go memory).
type fakeDevBuf struct {
	mem []float32
	eng DeviceEngine
}

func newFakeDevBuf(t *testing.T, count int, eng DeviceEngine) *fakeDevBuf {
	b, err := syscall.Mmap(-1, 0, 4*count, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return &fakeDevBuf{mem: unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), count), eng: eng}
}

func (b *fakeDevBuf) DataType() DataType { return Float32 }
func (b *fakeDevBuf) Len() int           { return len(b.mem) }
func (b *fakeDevBuf) HostBytes() []byte  { return nil }
func (b *fakeDevBuf) Ptr() uintptr       { return uintptr(unsafe.Pointer(&b.mem[0])) }
func (b *fakeDevBuf) Engine() DeviceEngine {
	return b.eng
}
func (b *fakeDevBuf) CopyToHost(dst []byte) error {
	copy(dst, asBytes(b.mem))
	return nil
}
func (b *fakeDevBuf) CopyFromHost(src []byte) error {
	copy(asBytes(b.mem), src)
	return nil
}

// runFakeRanks runs f on n in-process ranks and returns their errors.
func runFakeRanks(t *testing.T, n int, f func(c *Comm) error) []error {
	t.Helper()
	cs, err := InitLocal(n, &Config{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[c.Rank()] = f(c)
		}()
	}
	wg.Wait()
	return errs
}

// A rank that cannot map its peers' buffers fails the call, and so must
// every rank; it must not return while its peers still read and write its
// buffers (its caller may free or reuse them at once).
func TestReviewDeviceImportFailure(t *testing.T) {
	const n, count = 3, 64
	var waits atomic.Int64
	var after [n]int64
	var bufs [n]*fakeDevBuf
	for r := range bufs {
		eng := &fakeEngine{name: "fake", failImport: r == 1, waitDelay: 100 * time.Millisecond, waits: &waits}
		bufs[r] = newFakeDevBuf(t, count, eng)
	}
	errs := runFakeRanks(t, n, func(c *Comm) error {
		r := c.Rank()
		x := bufs[r]
		for i := range x.mem {
			x.mem[i] = float32(r + i)
		}
		err := c.AllReduce(context.Background(), x, x, Sum)
		after[r] = waits.Load()
		return err
	})
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d succeeded, its peer 1 could not run its share", r)
		}
		var oe *OpError
		if !errors.As(err, &oe) {
			t.Errorf("rank %d: %v, not an *OpError", r, err)
		}
	}
	if after[1] != n-1 {
		t.Errorf("rank 1 returned when %d of its %d peers had finished their device work", after[1], n-1)
	}
}

// Device memory that cannot be exported (cuIpcGetMemHandle refuses memory
// from cuMemCreate or stream-ordered pools, as PyTorch's allocator may
// hand out) is still memory the host path can stage: the call succeeds
// through host staging on every rank instead of aborting the Comm.
func TestReviewDeviceExportFailureStages(t *testing.T) {
	const n, count = 3, 100
	var bufs [n]*fakeDevBuf
	for r := range bufs {
		bufs[r] = newFakeDevBuf(t, count, &fakeEngine{name: "fake", failExport: r == 2})
	}
	errs := runFakeRanks(t, n, func(c *Comm) error {
		r := c.Rank()
		x := bufs[r]
		for i := range x.mem {
			x.mem[i] = float32(r + i)
		}
		if err := c.AllReduce(context.Background(), x, x, Sum); err != nil {
			return err
		}
		for i, v := range x.mem {
			if want := float32(n*(n-1)/2 + n*i); v != want {
				return fmt.Errorf("element %d = %v, want %v", i, v, want)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
