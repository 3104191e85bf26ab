// Package devicetest is an in-memory implementation of package device's
// interfaces, for tests: an Engine whose "device memory" is host memory
// outside the Go heap, whose work runs at once, and whose failures can be
// switched on; Buffers and StreamBuffers over it. Any test may import it,
// as wireguard-go's tests import tun/tuntest.
package devicetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/reduce"
)

// Engine is a device.StreamEngine over host memory: addresses are process
// addresses, a description carries the address and length, and Reduce and
// Copy run before they return. Its streams are only names: each stream
// call does its work before it returns (a flag wait waits in the caller),
// so work runs in the order it is queued on every stream at once, and
// Follow has nothing to do. Flags, WriteFlag and WaitFlag take only words of memory
// MapFlags mapped (and not yet unmapped) on this engine, as a device's
// stream reaches only such memory. Set the fields before use.
type Engine struct {
	// EngineName is what Name returns.
	EngineName string
	// FailImport and FailExport make Import and AppendExport fail, as an
	// engine that cannot map a peer's memory or share its own would.
	FailImport, FailExport bool
	// WaitDelay is how long Wait sleeps.
	WaitDelay time.Duration

	// FlagTimeout bounds how long WaitFlag waits for its word; zero means
	// 30 s. A wait that times out fails, naming the word and the values,
	// where a device's stream would wait for ever.
	FlagTimeout time.Duration

	// Counters of completed calls. ReduceOn and CopyOn count in Reduces
	// and Copies too.
	Readies, Waits, Reduces, Copies atomic.Int64
	// StreamOps counts the completed stream calls (device.StreamEngine),
	// so that a test can tell the stream path ran: the flag writes and
	// waits (one by one), the Flags calls (Batches), ReduceOn, CopyOn and
	// Follow.
	StreamOps struct{ Writes, Waits, Batches, Reduces, Copies, Follows atomic.Int64 }

	mu    sync.Mutex
	flags [][]byte // mapped by MapFlags, not yet unmapped
	acc   []byte   // Reduce's accumulator
}

var _ device.StreamEngine = (*Engine)(nil)

// NewEngine returns an engine named name.
func NewEngine(name string) *Engine { return &Engine{EngineName: name} }

func (e *Engine) Name() string { return e.EngineName }

func (e *Engine) Ready() error {
	e.Readies.Add(1)
	return nil
}

// descLen is the length of the descriptions: address and length.
const descLen = 16

func (e *Engine) AppendExport(dst []byte, ptr uintptr, n int) ([]byte, error) {
	if e.FailExport {
		return nil, errors.New("devicetest: memory of another allocator, no IPC handle")
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ptr))
	return binary.LittleEndian.AppendUint64(dst, uint64(n)), nil
}

func (e *Engine) Import(desc []byte, n int) (uintptr, error) {
	if e.FailImport {
		return 0, errors.New("devicetest: cannot map the peer's memory")
	}
	if len(desc) != descLen {
		return 0, fmt.Errorf("devicetest: a %d-byte description, want %d", len(desc), descLen)
	}
	if have := binary.LittleEndian.Uint64(desc[8:]); uint64(n) > have {
		return 0, fmt.Errorf("devicetest: %d bytes of a %d-byte export", n, have)
	}
	return uintptr(binary.LittleEndian.Uint64(desc)), nil
}

// Reduce computes the reduction with gccl's host kernels, every type and op
// as device.Reduce defines them.
func (e *Engine) Reduce(r *device.Reduce) error {
	if len(r.In) == 0 || len(r.Out) == 0 {
		return fmt.Errorf("devicetest: a reduction of %d inputs into %d outputs", len(r.In), len(r.Out))
	}
	n := r.Count * r.DataType.Size()
	if n <= 0 {
		return nil
	}
	// The accumulator, reused (a collective's calls allocate nothing;
	// the tests count): outputs may alias inputs.
	e.mu.Lock()
	defer e.mu.Unlock()
	if cap(e.acc) < n {
		e.acc = make([]byte, n)
	}
	acc := e.acc[:n]
	in := func(i int) []byte { return mem(r.In[i], n) }
	kop := reduce.Sum
	scaled, s := false, 0.0
	switch r.Op.Kind {
	case dtype.OpProd:
		kop = reduce.Prod
	case dtype.OpMin:
		kop = reduce.Min
	case dtype.OpMax:
		kop = reduce.Max
	case dtype.OpAvg:
		scaled, s = r.DataType.IsFloat(), 1/float64(r.Ranks)
	case dtype.OpPreMulSum:
		scaled, s = true, r.Op.Scalar
	}
	if scaled {
		reduce.Scale(r.DataType)(acc, in(0), s)
		for i := 1; i < len(r.In); i++ {
			reduce.Axpy(r.DataType)(acc, acc, in(i), s)
		}
	} else {
		copy(acc, in(0))
		for i := 1; i < len(r.In); i++ {
			reduce.Lookup(r.DataType, kop)(acc, acc, in(i))
		}
		if r.Op.Kind == dtype.OpAvg {
			reduce.Div(r.DataType)(acc, acc, r.Ranks)
		}
	}
	for _, o := range r.Out {
		copy(mem(o, n), acc)
	}
	e.Reduces.Add(1)
	return nil
}

func (e *Engine) Copy(dst, src uintptr, n int) error {
	copy(mem(dst, n), mem(src, n))
	e.Copies.Add(1)
	return nil
}

func (e *Engine) Wait() error {
	time.Sleep(e.WaitDelay)
	e.Waits.Add(1)
	return nil
}

// MapFlags returns the address of b, which the engine's "device" reaches
// as it is, and lets WriteFlag and WaitFlag use its words.
func (e *Engine) MapFlags(b []byte) (uintptr, error) {
	if len(b) == 0 {
		return 0, errors.New("devicetest: mapping no flags")
	}
	e.mu.Lock()
	e.flags = append(e.flags, b)
	e.mu.Unlock()
	return uintptr(unsafe.Pointer(&b[0])), nil
}

// UnmapFlags undoes MapFlags of b.
func (e *Engine) UnmapFlags(b []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, m := range e.flags {
		if len(b) > 0 && &m[0] == &b[0] {
			e.flags = slices.Delete(e.flags, i, i+1)
			return nil
		}
	}
	return fmt.Errorf("devicetest: unmapping %d bytes of flags at %p that MapFlags did not map", len(b), unsafe.SliceData(b))
}

// flagWord returns the word at address p of the mapped flags. It derives
// the pointer from the mapped slice, not from p alone, which the race
// detector's pointer checks (checkptr) refuse for Go memory.
func (e *Engine) flagWord(p uintptr) (*uint32, error) {
	if p%4 != 0 {
		return nil, fmt.Errorf("devicetest: the flag at %#x is not 4-byte aligned", p)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.flags {
		base := uintptr(unsafe.Pointer(&m[0]))
		if p >= base && p-base < uintptr(len(m)) && uintptr(len(m))-(p-base) >= 4 {
			return (*uint32)(unsafe.Pointer(&m[p-base])), nil
		}
	}
	return nil, fmt.Errorf("devicetest: the flag at %#x is in no memory MapFlags mapped", p)
}

// WriteFlag stores v into the word at p. The store is atomic, and orders
// the writes of the calls made before it (which completed) before it.
func (e *Engine) WriteFlag(s, p uintptr, v uint32) error {
	w, err := e.flagWord(p)
	if err != nil {
		return err
	}
	atomic.StoreUint32(w, v)
	e.StreamOps.Writes.Add(1)
	return nil
}

// WaitFlag waits until the word at p reaches v in wrapping order
// (int32(word-v) >= 0), for at most FlagTimeout.
func (e *Engine) WaitFlag(s, p uintptr, v uint32) error {
	w, err := e.flagWord(p)
	if err != nil {
		return err
	}
	reached := func() bool { return int32(atomic.LoadUint32(w)-v) >= 0 }
	// A peer that is running writes the word soon: spin a little, then
	// sleep, longer and longer, so that a slow one costs no CPU.
	for range 100 {
		if reached() {
			e.StreamOps.Waits.Add(1)
			return nil
		}
		runtime.Gosched()
	}
	timeout := e.FlagTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for sleep := 20 * time.Microsecond; !reached(); sleep = min(2*sleep, time.Millisecond) {
		if time.Now().After(deadline) {
			return errs.Errorf(errs.ErrTimeout, "devicetest: the flag at %#x is %d after %v, short of %d", p, atomic.LoadUint32(w), timeout, v)
		}
		time.Sleep(sleep)
	}
	e.StreamOps.Waits.Add(1)
	return nil
}

// Flags runs ops in order, each as WriteFlag or WaitFlag does, after
// checking every word (a device refuses a batch whole).
func (e *Engine) Flags(s uintptr, ops []device.FlagOp) error {
	if len(ops) > device.MaxFlagOps {
		return fmt.Errorf("devicetest: %d flag operations at once, at most %d", len(ops), device.MaxFlagOps)
	}
	for _, op := range ops {
		if _, err := e.flagWord(op.Addr); err != nil {
			return err
		}
	}
	for _, op := range ops {
		var err error
		if op.Wait {
			err = e.WaitFlag(s, op.Addr, op.Value)
		} else {
			err = e.WriteFlag(s, op.Addr, op.Value)
		}
		if err != nil {
			return err
		}
	}
	e.StreamOps.Batches.Add(1)
	return nil
}

// ReduceOn is Reduce: the work is done before it returns.
func (e *Engine) ReduceOn(s uintptr, r *device.Reduce) error {
	if err := e.Reduce(r); err != nil {
		return err
	}
	e.StreamOps.Reduces.Add(1)
	return nil
}

// CopyOn is Copy: the copy is done before it returns.
func (e *Engine) CopyOn(s, dst, src uintptr, n int) error {
	if err := e.Copy(dst, src, n); err != nil {
		return err
	}
	e.StreamOps.Copies.Add(1)
	return nil
}

// Follow does nothing: the work queued on prev is already done.
func (e *Engine) Follow(s, prev uintptr) error {
	e.StreamOps.Follows.Add(1)
	return nil
}

// mem is the n bytes at address p.
func mem(p uintptr, n int) []byte { return unsafe.Slice((*byte)(unsafe.Add(nil, p)), n) }

// NopHold is a device.Hold that holds nothing.
type NopHold struct{}

func (NopHold) Ready() error { return nil }
func (NopHold) Release()     {}
