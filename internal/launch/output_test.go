package launch

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

func write(t *testing.T, w *lineTagger, s string) {
	t.Helper()
	if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
		t.Fatalf("Write(%q) = %d, %v", s, n, err)
	}
}

func TestLineTaggerInterleavedPartialWrites(t *testing.T) {
	var out bytes.Buffer
	dst := lockedWriter{&sync.Mutex{}, &out}
	r0 := newLineTagger(dst, "[rank 0] ")
	r1 := newLineTagger(dst, "[rank 1] ")
	write(t, r0, "hel")
	write(t, r1, "wor")
	write(t, r0, "lo\nsecond ")
	write(t, r1, "ld\n")
	write(t, r1, "\n") // an empty line is still a line
	write(t, r0, "line\nthird\nunfinished")
	if err := r0.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	want := "[rank 0] hello\n" +
		"[rank 1] world\n" +
		"[rank 1] \n" +
		"[rank 0] second line\n[rank 0] third\n" +
		"[rank 0] unfinished\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestLineTaggerWithoutPrefixStillKeepsLinesWhole(t *testing.T) {
	var out bytes.Buffer
	dst := lockedWriter{&sync.Mutex{}, &out}
	a, b := newLineTagger(dst, ""), newLineTagger(dst, "")
	write(t, a, "aa")
	write(t, b, "bb\n")
	write(t, a, "aa\n")
	if got, want := out.String(), "bb\naaaa\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

// TestLineTaggerConcurrentRanks writes lines from several goroutines in
// random pieces and checks that every output line is one whole input line.
func TestLineTaggerConcurrentRanks(t *testing.T) {
	const ranks, lines = 4, 300
	var out bytes.Buffer
	dst := lockedWriter{&sync.Mutex{}, &out}
	var wg sync.WaitGroup
	for r := range ranks {
		w := newLineTagger(dst, fmt.Sprintf("[rank %d] ", r))
		rng := rand.New(rand.NewPCG(uint64(r), 1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var text strings.Builder
			for i := range lines {
				fmt.Fprintf(&text, "line %d of rank %d %s\n", i, r, strings.Repeat("x", i%50))
			}
			b := []byte(text.String())
			for len(b) > 0 {
				n := min(1+rng.IntN(40), len(b))
				if _, err := w.Write(b[:n]); err != nil {
					t.Error(err)
					return
				}
				b = b[n:]
			}
		}()
	}
	wg.Wait()
	next := make([]int, ranks)
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var r, i, r2 int
		var xs string
		n, _ := fmt.Sscanf(line, "[rank %d] line %d of rank %d %s", &r, &i, &r2, &xs)
		if n < 3 || r != r2 || r < 0 || r >= ranks || i != next[r] || (n == 4) != (i%50 != 0) || len(xs) != i%50 {
			t.Fatalf("mangled or out-of-order line %q", line)
		}
		next[r]++
	}
	for r, n := range next {
		if n != lines {
			t.Errorf("rank %d: %d lines, want %d", r, n, lines)
		}
	}
}

func TestLineTaggerSplitsOverlongLines(t *testing.T) {
	var out bytes.Buffer
	w := newLineTagger(lockedWriter{&sync.Mutex{}, &out}, "> ")
	long := strings.Repeat("a", maxLineBytes+10)
	write(t, w, long)
	write(t, w, "b\n")
	want := "> " + long[:maxLineBytes] + "\n> " + strings.Repeat("a", 10) + "b\n"
	if out.String() != want {
		t.Errorf("got %d bytes, want %d: a line longer than %d bytes must be cut into tagged pieces",
			out.Len(), len(want), maxLineBytes)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("closed pipe") }

func TestLineTaggerReportsDestinationErrors(t *testing.T) {
	w := newLineTagger(failingWriter{}, "")
	if _, err := w.Write([]byte("partial")); err != nil {
		t.Errorf("a partial line is only buffered, got %v", err)
	}
	if _, err := w.Write([]byte(" line\n")); err == nil {
		t.Error("a failing destination must fail the write, so the child sees a broken pipe")
	}
}
