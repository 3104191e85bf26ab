package comm_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/reduce"
)

// world creates n in-process ranks and closes them when the test ends,
// checking that no goroutine is left behind.
func world(t testing.TB, n int, cfg *comm.Config) []*comm.Comm {
	t.Helper()
	before := runtime.NumGoroutine()
	cs, err := comm.InitLocal(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
		checkNoLeak(t, before)
	})
	return cs
}

// checkNoLeak fails the test if goroutines started since before are still
// alive after a grace period (like grpc-go's leakcheck).
func checkNoLeak(t testing.TB, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("%d goroutines leaked:\n%s", runtime.NumGoroutine()-before, buf)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// onAll runs f on every rank concurrently and returns each rank's error. A
// rank still running after the limit is reported as hung.
func onAll(t testing.TB, cs []*comm.Comm, f func(c *comm.Comm) error) []error {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(c)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		for _, c := range cs {
			c.Abort(fmt.Errorf("test hung"))
		}
		<-done
		t.Fatalf("ranks hung; errors after abort: %v", errs)
	}
	return errs
}

// mustAll fails the test if any rank failed.
func mustAll(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

var bg = context.Background()

// Element codecs over raw bytes, so that one harness covers every type.

func putF(dt comm.DataType, b []byte, i int, v float64) {
	switch dt {
	case comm.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case comm.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	case comm.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], reduce.F32ToF16(float32(v)))
	case comm.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], reduce.F32ToBF16(float32(v)))
	case comm.Float8E4M3:
		b[i] = reduce.F32ToE4M3(float32(v))
	case comm.Float8E5M2:
		b[i] = reduce.F32ToE5M2(float32(v))
	default:
		panic(dt)
	}
}

func getF(dt comm.DataType, b []byte, i int) float64 {
	switch dt {
	case comm.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case comm.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case comm.Float16:
		return float64(reduce.F16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case comm.BFloat16:
		return float64(reduce.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case comm.Float8E4M3:
		return float64(reduce.E4M3ToF32(b[i]))
	case comm.Float8E5M2:
		return float64(reduce.E5M2ToF32(b[i]))
	}
	panic(dt)
}

// putI stores the low bits of v; getI sign- or zero-extends.
func putI(dt comm.DataType, b []byte, i int, v int64) {
	switch dt.Size() {
	case 1:
		b[i] = byte(v)
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case 8:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
}

func getI(dt comm.DataType, b []byte, i int) int64 {
	switch dt {
	case comm.Int8:
		return int64(int8(b[i]))
	case comm.Uint8:
		return int64(b[i])
	case comm.Int32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case comm.Uint32:
		return int64(binary.LittleEndian.Uint32(b[4*i:]))
	case comm.Int64, comm.Uint64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	panic(dt)
}

// wrap reduces v to the width and signedness of dt, as the type's own
// arithmetic would.
func wrap(dt comm.DataType, v int64) int64 {
	switch dt {
	case comm.Int8:
		return int64(int8(v))
	case comm.Uint8:
		return int64(uint8(v))
	case comm.Int32:
		return int64(int32(v))
	case comm.Uint32:
		return int64(uint32(v))
	}
	return v
}

// divT is integer division in dt's signedness, truncating like Go.
func divT(dt comm.DataType, v int64, n int) int64 {
	if dt == comm.Uint64 {
		return int64(uint64(v) / uint64(n))
	}
	return wrap(dt, v/int64(n)) // narrower types are exact in int64
}

func lessT(dt comm.DataType, a, b int64) bool {
	if dt == comm.Uint64 {
		return uint64(a) < uint64(b)
	}
	return a < b
}

// mantissaBits is the number of stored fraction bits of a float type.
func mantissaBits(dt comm.DataType) int {
	switch dt {
	case comm.Float64:
		return 52
	case comm.Float32:
		return 23
	case comm.Float16:
		return 10
	case comm.BFloat16:
		return 7
	case comm.Float8E4M3:
		return 3
	case comm.Float8E5M2:
		return 2
	}
	panic(dt)
}

// minExp is the exponent of a float type's smallest normal value.
func minExp(dt comm.DataType) int {
	switch dt {
	case comm.Float64:
		return -1022
	case comm.Float32, comm.BFloat16:
		return -126
	case comm.Float16:
		return -14
	case comm.Float8E4M3:
		return -6
	case comm.Float8E5M2:
		return -14
	}
	panic(dt)
}

// unitRoundoff is half the gap between 1 and the next value of dt.
func unitRoundoff(dt comm.DataType) float64 { return math.Ldexp(1, -mantissaBits(dt)-1) }

// tinyStep is the spacing of dt's subnormals: the absolute error floor.
func tinyStep(dt comm.DataType) float64 { return math.Ldexp(1, minExp(dt)-mantissaBits(dt)) }

// hash gives deterministic pseudo-random bits for (rank, index, salt).
func hash(r, i, salt int) uint64 {
	x := uint64(r)*0x9E3779B97F4A7C15 ^ uint64(i)*0xC2B2AE3D27D4EB4F ^ uint64(salt)*0x165667B19E3779F9
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return x
}

// anyIs reports whether some rank's error is target.
func anyIs(errs []error, target error) bool {
	for _, err := range errs {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
