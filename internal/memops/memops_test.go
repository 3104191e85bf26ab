package memops

import (
	"bytes"
	"fmt"
	"testing"
)

// Every length around the thresholds and the 128-byte blocks, at every
// destination misalignment, against copy; bytes around dst stay untouched.
func TestCopyNT(t *testing.T) {
	src := make([]byte, 3*ntMinBytes+300)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	buf := make([]byte, len(src)+128)
	for _, n := range []int{0, 1, 127, ntMinBytes - 1, ntMinBytes, ntMinBytes + 1, ntMinBytes + 127, 2*ntMinBytes + 129, len(src)} {
		for off := 0; off < 33; off++ {
			for i := range buf {
				buf[i] = 0xEE
			}
			dst := buf[off+32 : off+32+n]
			if got := CopyNT(dst, src[:n]); got != n {
				t.Fatalf("n=%d off=%d: copied %d", n, off, got)
			}
			if !bytes.Equal(dst, src[:n]) {
				t.Fatalf("n=%d off=%d: wrong data", n, off)
			}
			for i, b := range buf {
				if (i < off+32 || i >= off+32+n) && b != 0xEE {
					t.Fatalf("n=%d off=%d: byte %d outside dst written", n, off, i)
				}
			}
		}
	}
	// Shorter source or destination: like copy.
	if got := CopyNT(make([]byte, 10*ntMinBytes), src[:ntMinBytes*2]); got != ntMinBytes*2 {
		t.Fatalf("copied %d, want %d", got, ntMinBytes*2)
	}
}

func TestCopyNTAllocatesNothing(t *testing.T) {
	dst, src := make([]byte, 1<<20), make([]byte, 1<<20)
	if a := testing.AllocsPerRun(10, func() { CopyNT(dst, src) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

// BenchmarkCopy compares copy with CopyNT on buffers far larger than the
// cache, so every destination line is cold.
func BenchmarkCopy(b *testing.B) {
	const span = 256 << 20
	src, dst := make([]byte, span), make([]byte, span)
	for i := range src {
		src[i], dst[i] = 1, 2
	}
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		for _, nt := range []bool{false, true} {
			b.Run(fmt.Sprintf("bytes=%d/nt=%v", size, nt), func(b *testing.B) {
				b.SetBytes(int64(size))
				off := 0
				for i := 0; i < b.N; i++ {
					if off+size > span {
						off = 0
					}
					if nt {
						CopyNT(dst[off:off+size], src[off:off+size])
					} else {
						copy(dst[off:off+size], src[off:off+size])
					}
					off += size
				}
			})
		}
	}
}
