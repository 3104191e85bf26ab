package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/p2p"
)

// The test binary is also the prefill process: Decode starts
// os.Executable(), and TestMain hands it the prefill role.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "prefill" {
		if err := prefillFromEnv(); err != nil {
			os.Stderr.WriteString("prefill: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDisagg(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		name := map[bool]string{false: "shm", true: "tcp"}[tcp]
		t.Run(name, func(t *testing.T) {
			if tcp {
				t.Setenv("GCCL_SHM_DISABLE", "1")
				t.Setenv("GCCL_P2P_PVM_DISABLE", "1")
			}
			c := Config{Layers: 8, Blocks: 4, BlockSize: 16 << 10, TCP: tcp, Dir: t.TempDir(), Compute: time.Millisecond}
			if err := Decode(c, os.Stdout); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// -rdma: over RDMA where this machine has a device (the rxe VM), else over
// tcp, saying why; every byte checked either way.
func TestDisaggRDMA(t *testing.T) {
	outPath := filepath.Join(t.TempDir(), "out")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, k := range []string{"GCCL_SHM_DISABLE", "GCCL_P2P_PVM_DISABLE", "GCCL_P2P_RDMA_SAME_HOST"} {
		t.Setenv(k, os.Getenv(k)) // restored after the test: Decode sets them
	}
	c := Config{Layers: 8, Blocks: 4, BlockSize: 16 << 10, RDMA: true, Dir: t.TempDir(), Compute: time.Millisecond}
	if err := Decode(c, out); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(outPath)
	t.Logf("%s", b)
	switch {
	case strings.Contains(string(b), "over rdma"):
	case os.Getenv("GCCL_TEST_REQUIRE_RDMA") == "1":
		t.Fatal("GCCL_TEST_REQUIRE_RDMA=1, but the layers did not go over rdma")
	case !strings.Contains(string(b), "over tcp") || !strings.Contains(string(b), "RDMA was asked for but not used"):
		t.Fatal("without RDMA the example does not say it used tcp, and why")
	}
}

// TestDisaggTwoHosts is the example across two hosts: tests/rxe/run.sh's
// two VMs (RXEVM_RANK 0 is decode, 1 prefill), each with its own Soft-RoCE
// device, first over RDMA, then with RDMA disabled over tcp, every byte of
// 32 layers checked by decode as each layer's notification arrives.
func TestDisaggTwoHosts(t *testing.T) {
	rank, peer, self := os.Getenv("RXEVM_RANK"), os.Getenv("RXEVM_PEER_ADDR"), os.Getenv("RXEVM_SELF_ADDR")
	if rank == "" {
		t.Skip("runs in tests/rxe/run.sh's two VMs (RXEVM_RANK, RXEVM_PEER_ADDR)")
	}
	for i, rdma := range []bool{true, false} {
		name := map[bool]string{true: "rdma", false: "tcp"}[rdma]
		t.Run(name, func(t *testing.T) {
			t.Setenv("GCCL_SHM_DISABLE", "1")
			t.Setenv("GCCL_P2P_PVM_DISABLE", "1")
			if !rdma {
				t.Setenv("GCCL_P2P_RDMA_DISABLE", "1")
			}
			// -rdma both times: with RDMA disabled the example says it used
			// tcp, and why.
			c := Config{Layers: 32, Blocks: 8, BlockSize: 64 << 10, RDMA: true, Dir: t.TempDir(), Compute: time.Millisecond}
			port := strconv.Itoa(7400 + i)
			if rank == "0" {
				c.Listen = net.JoinHostPort(self, port)
				if err := Decode(c, os.Stdout); err != nil {
					t.Fatal(err)
				}
				return
			}
			b, err := Prefill(c, net.JoinHostPort(peer, port))
			if err != nil {
				t.Fatal(err)
			}
			want := p2p.BackendRDMA
			if !rdma {
				want = p2p.BackendTCP
			}
			if b != want {
				t.Fatalf("rank %s: the layers went over %v, want %v", rank, b, want)
			}
			t.Logf("rank %s: 32 layers over %v", rank, b)
		})
	}
}

func TestCheckBlockFindsCorruption(t *testing.T) {
	b := make([]byte, 1000)
	fillBlock(b, 3, 2)
	if err := checkBlock(b, 3, 2); err != nil {
		t.Fatal(err)
	}
	b[777]++
	if err := checkBlock(b, 3, 2); err == nil {
		t.Fatal("a changed byte went unnoticed")
	}
}
