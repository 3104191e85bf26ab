// Package testutil holds small helpers that several packages' tests share.
package testutil

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/errs"
)

// SyncBuffer is a bytes.Buffer that loggers, child processes' output
// copiers and the test may use at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// EnvWithoutJob is the test process's environment minus everything that
// describes a job (gccl's, torchrun's, Open MPI's, PMI's, Slurm's variables),
// so that an outer launcher (CI under Slurm, say) cannot leak into the jobs a
// test starts.
func EnvWithoutJob() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "GCCL_"), strings.HasPrefix(k, "SLURM_"), strings.HasPrefix(k, "OMPI_"),
			strings.HasPrefix(k, "PMI_"), k == "RANK", k == "WORLD_SIZE", k == "LOCAL_RANK",
			k == "LOCAL_WORLD_SIZE", k == "MASTER_ADDR", k == "MASTER_PORT":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// TCPPair returns the two ends of a loopback TCP connection, closed when
// t ends (closing an end the test closed already does nothing).
func TCPPair(t testing.TB) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		got <- c
	}()
	dialed, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if accepted = <-got; accepted == nil {
		dialed.Close()
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { dialed.Close(); accepted.Close() })
	return dialed, accepted
}

// WaitFor polls cond every millisecond until it holds, failing t with what
// did not happen if it still does not after timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (waited %v)", what, timeout)
		}
	}
}

// SkipIfNotSupported skips t when err says the hardware or feature is
// absent here (errors.Is ErrNotSupported, of any gccl package), and fails
// it on any other error.
func SkipIfNotSupported(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, errs.ErrNotSupported):
		t.Skipf("not supported here: %v", err)
	default:
		t.Fatal(err)
	}
}
