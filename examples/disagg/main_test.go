package main

import (
	"os"
	"testing"
	"time"
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
