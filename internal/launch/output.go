package launch

import (
	"bytes"
	"io"
	"sync"
)

// maxLineBytes is the longest line, not counting its newline, that a rank's
// stream buffers and writes in one piece, so that it never mixes with
// another rank's output. 1 MiB holds any line a person or a log parser
// reads, while a rank printing megabytes without a newline costs at most
// this much memory per stream. A longer line is written in pieces of this
// size as it arrives; only such giant lines can interleave with other
// ranks' lines.
const maxLineBytes = 1 << 20

// lockedWriter serializes writes from all ranks' streams, so one Write (a
// batch of whole lines) never mixes with another. Stdout and stderr share
// one lock because callers may point both at the same writer.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// lineTagger is one rank's stdout or stderr. It buffers a partial line
// until its newline arrives and writes complete lines in one Write to the
// shared destination.
//
// With a prefix ("[rank R] ") every line, and every piece of a line longer
// than maxLineBytes, is written as prefix, text and newline; a final line
// without a newline gets one, so that the next rank's line starts on a line
// of its own. Without a prefix the stream passes through byte for byte:
// pieces of a giant line and a final unterminated line are written as they
// are.
//
// The output does not depend on how the input was split into Writes. One
// goroutine feeds it and then calls Close, so it needs no lock of its own.
type lineTagger struct {
	dst     io.Writer
	prefix  []byte // empty: untagged
	partial []byte // the unfinished line so far, at most maxLineBytes
	out     []byte // scratch for building a batch of lines
	err     error  // the destination's first error
}

func newLineTagger(dst io.Writer, prefix string) *lineTagger {
	return &lineTagger{dst: dst, prefix: []byte(prefix)}
}

// Write forwards every line that p completes and keeps the rest. An error
// from the destination is returned, so a child writing to a closed pipe
// sees it, as it would without the launcher.
func (t *lineTagger) Write(p []byte) (int, error) {
	n := len(p)
	t.out = t.out[:0]
	for len(p) > 0 {
		nl := bytes.IndexByte(p, '\n')
		if nl < 0 {
			t.partial = append(t.partial, p...)
			// Only more than maxLineBytes proves the line too long: at
			// exactly that many its newline may come next.
			rest := t.appendPieces(t.partial)
			t.partial = append(t.partial[:0], rest...)
			break
		}
		line := p[:nl]
		if len(t.partial) > 0 {
			t.partial = append(t.partial, line...)
			line = t.partial
		}
		t.appendLine(t.appendPieces(line), true)
		t.partial = t.partial[:0]
		p = p[nl+1:]
	}
	if len(t.out) == 0 {
		return n, nil
	}
	if _, err := t.dst.Write(t.out); err != nil {
		t.err = err
		return 0, err
	}
	return n, nil
}

func (t *lineTagger) tagged() bool { return len(t.prefix) > 0 }

// appendPieces adds to the batch the leading maxLineBytes pieces of line
// while more than maxLineBytes remain, and returns the rest.
func (t *lineTagger) appendPieces(line []byte) []byte {
	for len(line) > maxLineBytes {
		t.appendLine(line[:maxLineBytes], t.tagged())
		line = line[maxLineBytes:]
	}
	return line
}

// appendLine adds prefix, text and, if newline, a newline to the batch.
func (t *lineTagger) appendLine(text []byte, newline bool) {
	t.out = append(t.out, t.prefix...)
	t.out = append(t.out, text...)
	if newline {
		t.out = append(t.out, '\n')
	}
}

// Close writes a final line that had no newline: ended with one when
// tagged, as it is otherwise.
func (t *lineTagger) Close() error {
	if len(t.partial) == 0 {
		return nil
	}
	t.out = t.out[:0]
	t.appendLine(t.partial, t.tagged())
	t.partial = t.partial[:0]
	if _, err := t.dst.Write(t.out); err != nil {
		t.err = err
	}
	return t.err
}
