package uring

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The batch the p2p file backend's target case moves: 16 blocks of
// 64 KiB, O_DIRECT, on the test's temporary directory (skipped where it
// lacks O_DIRECT). GCCL_URING_BENCH_DIR picks another directory.
const benchBlock, benchDepth = 64 << 10, 16

func benchFile(b *testing.B) (int, []byte) {
	dir := os.Getenv("GCCL_URING_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	path := filepath.Join(dir, "uring-bench.dat")
	if err := os.WriteFile(path, make([]byte, benchBlock*benchDepth*16), 0o600); err != nil {
		b.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		b.Skipf("O_DIRECT: %v", err)
	}
	b.Cleanup(func() { unix.Close(fd); os.Remove(path) })
	raw := make([]byte, benchBlock*benchDepth+4096)
	skip := (4096 - int(uintptr(unsafe.Pointer(&raw[0]))%4096)) % 4096
	b.SetBytes(benchBlock * benchDepth)
	return fd, raw[skip : skip+benchBlock*benchDepth]
}

func BenchmarkODirectBatch(b *testing.B) {
	for _, write := range []bool{true, false} {
		name := map[bool]string{true: "write", false: "read"}[write]
		for _, fixed := range []bool{false, true} {
			b.Run(name+map[bool]string{false: "/io_uring", true: "/io_uring-fixed"}[fixed], func(b *testing.B) {
				fd, buf := benchFile(b)
				if err := Available(); err != nil {
					b.Skip(err)
				}
				r, err := New(benchDepth)
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				if fixed {
					if err := r.RegisterBuffers([][]byte{buf}); err != nil {
						b.Skip(err)
					}
				}
				for it := 0; b.Loop(); it++ {
					base := int64(it%16) * benchBlock * benchDepth
					for i := range benchDepth {
						blk := buf[i*benchBlock : (i+1)*benchBlock]
						switch {
						case write && fixed:
							r.PrepWriteFixed(fd, blk, base+int64(i*benchBlock), 0, uint64(i))
						case write:
							r.PrepWrite(fd, blk, base+int64(i*benchBlock), uint64(i))
						case fixed:
							r.PrepReadFixed(fd, blk, base+int64(i*benchBlock), 0, uint64(i))
						default:
							r.PrepRead(fd, blk, base+int64(i*benchBlock), uint64(i))
						}
					}
					for done := 0; done < benchDepth; {
						if _, err := r.Submit(benchDepth-done, 0); err != nil {
							b.Fatal(err)
						}
						for c, ok := r.Completion(); ok; c, ok = r.Completion() {
							if c.Res != benchBlock {
								b.Fatalf("res %d", c.Res)
							}
							done++
						}
					}
				}
			})
		}
		b.Run(name+"/goroutines", func(b *testing.B) {
			fd, buf := benchFile(b)
			for it := 0; b.Loop(); it++ {
				base := int64(it%16) * benchBlock * benchDepth
				var wg sync.WaitGroup
				for i := range benchDepth {
					blk := buf[i*benchBlock : (i+1)*benchBlock]
					off := base + int64(i*benchBlock)
					wg.Go(func() {
						if write {
							unix.Pwrite(fd, blk, off)
						} else {
							unix.Pread(fd, blk, off)
						}
					})
				}
				wg.Wait()
			}
		})
	}
}
