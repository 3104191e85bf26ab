package p2p

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/leakcheck"
)

// Cross-process tests re-execute the test binary as a target agent: TestMain
// sees childEnv and runs childMain instead of the tests. The child prints
// its metadata, then obeys notifications ("check ...", "exit") and answers
// on stdout, so its answers also prove that a notification is seen only
// after its data. A normal run fails if the tests leave goroutines running
// (leakcheck): every agent's goroutines end with its Close.
const childEnv = "GCCL_P2P_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := childMain(); err != nil {
			fmt.Fprintln(os.Stderr, "p2p test child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	leakcheck.Main(m)
}

const childSeed = 0x55

func childMain() error {
	size, _ := strconv.Atoi(os.Getenv("P2P_TEST_SIZE"))
	cfg := Config{ListenAddr: "127.0.0.1:0", Logger: testLogger()}
	if d, err := time.ParseDuration(os.Getenv("P2P_TEST_PEER_TIMEOUT")); err == nil {
		cfg.PeerTimeout = d
	}
	a, err := New("child", cfg)
	if err != nil {
		return err
	}
	defer a.Close()
	var r *Region
	var mem []byte
	read := func(off, n int) []byte { return mem[off : off+n] }
	switch {
	case os.Getenv("P2P_TEST_VRAM") == "1":
		// VRAM of the fake CUDA driver (GCCL_CUDA_LIBRARY, from the parent).
		d, err := cuda.Load()
		if err != nil {
			return err
		}
		ctx, err := d.Retain(1)
		if err != nil {
			return err
		}
		p, err := ctx.Alloc(size + 8192)
		if err != nil {
			return err
		}
		p += 4096 // the region starts inside its allocation
		mem = make([]byte, size)
		fill(mem, childSeed)
		if err := ctx.CopyToDevice(p, mem); err != nil {
			return err
		}
		if r, err = a.RegisterVRAM(uint64(p), uint64(size), 1); err != nil {
			return err
		}
		read = func(off, n int) []byte {
			b := make([]byte, n)
			if err := ctx.CopyFromDevice(b, p+cuda.DevicePtr(off)); err != nil {
				return nil
			}
			return b
		}
	case os.Getenv("P2P_TEST_HEAP") == "1":
		r, err = a.RegisterMem(make([]byte, size))
	default:
		r, err = a.Alloc(size)
	}
	if err != nil {
		return err
	}
	if mem == nil {
		mem = r.Bytes()
		fill(mem, childSeed)
	}
	fmt.Printf("MD %s\n", hex.EncodeToString(a.LocalMetadata()))
	for {
		notifs, err := a.WaitNotifs(context.Background())
		if err != nil {
			return err
		}
		for from, msgs := range notifs {
			for _, m := range msgs {
				f := strings.Fields(string(m))
				switch {
				case len(f) == 5 && f[0] == "check":
					seed, _ := strconv.Atoi(f[1])
					off, _ := strconv.Atoi(f[2])
					n, _ := strconv.Atoi(f[3])
					want := make([]byte, n)
					fill(want, byte(seed))
					if off+n <= len(mem) && bytes.Equal(read(off, n), want) {
						fmt.Printf("OK %s\n", f[4])
					} else {
						fmt.Printf("BAD %s\n", f[4])
					}
				case len(f) == 1 && f[0] == "exit":
					return nil
				case len(f) == 1 && f[0] == "dereg":
					fmt.Printf("DEREG %v\n", a.DeregisterMem(r))
				default:
					fmt.Printf("N %s %s\n", from, m)
				}
			}
		}
	}
}
