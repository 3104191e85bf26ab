package launch

import (
	"bytes"
	"io"
	"sync"
)

// maxLineBytes bounds how much of an unfinished line a stream buffers: a
// rank printing megabytes without a newline gets its output cut into
// tagged pieces of this size rather than growing memory without end.
const maxLineBytes = 64 << 10

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
// until its newline arrives and writes complete lines, each with the
// rank's prefix, in one Write to the shared destination. os/exec feeds it
// from a single goroutine per stream, and Close runs after that goroutine
// is done, so it needs no lock of its own.
type lineTagger struct {
	dst     io.Writer
	prefix  []byte
	partial []byte // the unfinished line so far
	out     []byte // scratch for building a batch of tagged lines
}

func newLineTagger(dst io.Writer, prefix string) *lineTagger {
	return &lineTagger{dst: dst, prefix: []byte(prefix)}
}

// Write tags and forwards every line that p completes and keeps the rest.
// An error from the destination is returned, so a child writing to a closed
// pipe sees it, as it would without the launcher.
func (t *lineTagger) Write(p []byte) (int, error) {
	n := len(p)
	t.out = t.out[:0]
	for len(p) > 0 {
		nl := bytes.IndexByte(p, '\n')
		if nl < 0 {
			t.partial = append(t.partial, p...)
			for len(t.partial) >= maxLineBytes {
				t.appendLine(t.partial[:maxLineBytes])
				t.partial = append(t.partial[:0], t.partial[maxLineBytes:]...)
			}
			break
		}
		if len(t.partial) > 0 {
			t.partial = append(t.partial, p[:nl]...)
			t.appendLine(t.partial)
			t.partial = t.partial[:0]
		} else {
			t.appendLine(p[:nl])
		}
		p = p[nl+1:]
	}
	if len(t.out) == 0 {
		return n, nil
	}
	if _, err := t.dst.Write(t.out); err != nil {
		return 0, err
	}
	return n, nil
}

// appendLine adds prefix, line and a newline to the batch.
func (t *lineTagger) appendLine(line []byte) {
	t.out = append(t.out, t.prefix...)
	t.out = append(t.out, line...)
	t.out = append(t.out, '\n')
}

// Close writes a final line that had no newline, ending it with one so the
// next rank's line starts on a line of its own.
func (t *lineTagger) Close() error {
	if len(t.partial) == 0 {
		return nil
	}
	t.out = t.out[:0]
	t.appendLine(t.partial)
	t.partial = t.partial[:0]
	_, err := t.dst.Write(t.out)
	return err
}
