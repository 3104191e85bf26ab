package launch

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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

// feed writes in to a new lineTagger in pieces cut at splits (ascending
// offsets into in), closes it and returns what reached the destination.
func feed(t *testing.T, prefix string, in []byte, splits []int) string {
	t.Helper()
	var out bytes.Buffer
	w := newLineTagger(&out, prefix)
	last := 0
	for _, at := range append(splits, len(in)) {
		if n, err := w.Write(in[last:at]); err != nil || n != at-last {
			t.Fatalf("Write of %d bytes = %d, %v", at-last, n, err)
		}
		last = at
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// tagged is what tagging makes of in, written out the long way: every line
// cut into pieces of at most maxLineBytes (an empty line is one empty
// piece), each piece prefixed and ended with a newline, a last line
// without a newline too.
func tagged(prefix string, in []byte) string {
	var b strings.Builder
	lines := strings.Split(string(in), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1] // in ended with a newline
	}
	for _, line := range lines {
		for {
			n := min(len(line), maxLineBytes)
			b.WriteString(prefix + line[:n] + "\n")
			if line = line[n:]; line == "" {
				break
			}
		}
	}
	return b.String()
}

// TestLineTaggerLineLengthBoundaries feeds lines just below, at and above
// maxLineBytes (and its double), with and without a final newline, cut
// into reads at every offset where the cutting could matter, and at every
// pair of them unless -short. Untagged output must equal the input; tagged
// output must not depend on the cuts.
func TestLineTaggerLineLengthBoundaries(t *testing.T) {
	const L = maxLineBytes
	for _, n := range []int{L - 1, L, L + 1, 2 * L, 2*L + 1} {
		line := bytes.Repeat([]byte{'x'}, n)
		for _, in := range [][]byte{
			append(append([]byte{}, line...), '\n'),
			append(append([]byte{}, line...), "\nafter\n"...),
			line, // no newline at all
		} {
			// Offsets around each multiple of L, the newline and the end.
			var offsets []int
			for _, o := range []int{1, L - 1, L, L + 1, 2*L - 1, 2 * L, 2*L + 1, n - 1, n, n + 1, len(in) - 1} {
				if o > 0 && o < len(in) && !slices.Contains(offsets, o) {
					offsets = append(offsets, o)
				}
			}
			slices.Sort(offsets)
			cuts := [][]int{nil}
			for i, a := range offsets {
				cuts = append(cuts, []int{a})
				for _, b := range offsets[i+1:] {
					if !testing.Short() {
						cuts = append(cuts, []int{a, b})
					}
				}
			}
			wantTagged := tagged("[rank 0] ", in)
			for _, c := range cuts {
				if got := feed(t, "", in, c); got != string(in) {
					t.Fatalf("untagged, line of %d bytes, %d bytes in all, cut at %v: got %d bytes with %d newlines, want the input (%d newlines)",
						n, len(in), c, len(got), strings.Count(got, "\n"), strings.Count(string(in), "\n"))
				}
				if got := feed(t, "[rank 0] ", in, c); got != wantTagged {
					t.Fatalf("tagged, line of %d bytes, %d bytes in all, cut at %v: got %d lines, want %d",
						n, len(in), c, strings.Count(got, "\n"), strings.Count(wantTagged, "\n"))
				}
			}
		}
	}
}

// TestLineTaggerUntaggedIsByteExact passes arbitrary bytes, newlines and a
// last line without one, in random pieces, through an untagged stream.
func TestLineTaggerUntaggedIsByteExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	in := make([]byte, 3*maxLineBytes)
	for i := range in {
		in[i] = byte(rng.IntN(256))
	}
	var cuts []int
	for at := rng.IntN(100000); at < len(in); at += 1 + rng.IntN(100000) {
		cuts = append(cuts, at)
	}
	if got := feed(t, "", in, cuts); got != string(in) {
		t.Errorf("got %d bytes, want the %d bytes of input unchanged", len(got), len(in))
	}
	if got := feed(t, "", []byte("no newline"), nil); got != "no newline" {
		t.Errorf("a last line without a newline came out as %q", got)
	}
}

// TestLineTaggerLongLinesOfTwoRanksStayWhole writes two ranks' lines of
// 300000 bytes in alternating 10000-byte pieces: each must come out whole.
func TestLineTaggerLongLinesOfTwoRanksStayWhole(t *testing.T) {
	for _, prefix := range []string{"", "[rank R] "} {
		var out bytes.Buffer
		dst := lockedWriter{&sync.Mutex{}, &out}
		a, b := newLineTagger(dst, prefix), newLineTagger(dst, prefix)
		for range 30 {
			write(t, a, strings.Repeat("a", 10000))
			write(t, b, strings.Repeat("b", 10000))
		}
		write(t, b, "\n")
		write(t, a, "\n")
		want := prefix + strings.Repeat("b", 300000) + "\n" + prefix + strings.Repeat("a", 300000) + "\n"
		if out.String() != want {
			t.Errorf("prefix %q: lines came out mixed or cut: %d lines of %d bytes in all",
				prefix, strings.Count(out.String(), "\n"), out.Len())
		}
	}
}
