// Package records holds what comm's per-operation records and p2p's
// per-transfer records share: the latency histogram's buckets, the
// placeholders of a telemetry file's name, and the writer that drains
// records into a JSON-lines file off the operations' path.
package records

import (
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// LatencyBuckets is the number of buckets of a latency histogram.
const LatencyBuckets = 14

// LatencyBounds are the upper bounds of the buckets: 1 µs to about 17 s by
// powers of four; the last bucket counts what took longer.
var LatencyBounds = func() [LatencyBuckets - 1]time.Duration {
	var b [LatencyBuckets - 1]time.Duration
	d := time.Microsecond
	for i := range b {
		b[i] = d
		d *= 4
	}
	return b
}()

// Bucket is the histogram bucket of d.
func Bucket(d time.Duration) int {
	for i, b := range LatencyBounds {
		if d <= b {
			return i
		}
	}
	return LatencyBuckets - 1
}

// ExpandPath replaces %r with who (a rank, or an agent's name), %p with
// the process ID, %h with the host name and %% with %, so that one setting
// serves every process of a job.
func ExpandPath(pattern, who string) string {
	if !strings.Contains(pattern, "%") {
		return pattern
	}
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		if pattern[i] != '%' || i+1 == len(pattern) {
			b.WriteByte(pattern[i])
			continue
		}
		i++
		switch pattern[i] {
		case 'r':
			b.WriteString(who)
		case 'p':
			b.WriteString(strconv.Itoa(os.Getpid()))
		case 'h':
			h, _ := os.Hostname()
			b.WriteString(h)
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(pattern[i])
		}
	}
	return b.String()
}

// FlushEvery is how long a record may wait for the writer.
const FlushEvery = 100 * time.Millisecond

// Writer appends records to a file from a goroutine of its own: every
// FlushEvery, when woken, and once more when closed, it calls the owner's
// drain, which formats what was recorded since and hands it to Write.
type Writer struct {
	f      *os.File
	drain  func(*Writer)
	warn   func(msg string, err error)
	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}
	failed bool
}

// Open opens (appends to, or creates) the file name and starts its writer.
// warn reports a write or close that failed; after a failed write nothing
// more is written.
func Open(name string, drain func(*Writer), warn func(msg string, err error)) (*Writer, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	w := &Writer{f: f, drain: drain, warn: warn, wake: make(chan struct{}, 1), stop: make(chan struct{}),
		exited: make(chan struct{})}
	go w.run()
	return w, nil
}

// Wake makes the writer drain soon; it never blocks.
func (w *Writer) Wake() {
	select {
	case w.wake <- struct{}{}:
	default: // already awake, or about to be
	}
}

// Close drains what is left, closes the file and waits for the writer.
func (w *Writer) Close() {
	close(w.stop)
	<-w.exited
}

// Write writes b to the file (drain calls it), unless a write failed.
func (w *Writer) Write(b []byte) {
	if len(b) == 0 || w.failed {
		return
	}
	if _, err := w.f.Write(b); err != nil {
		w.failed = true
		w.warn("telemetry file: writing stopped", err)
	}
}

func (w *Writer) run() {
	defer close(w.exited)
	tick := time.NewTicker(FlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			w.drain(w)
			if err := w.f.Close(); err != nil && !w.failed {
				w.warn("telemetry file", err)
			}
			return
		case <-w.wake:
		case <-tick.C:
		}
		w.drain(w)
	}
}

// AppendTimes appends a record's timing fields to a JSON object being
// built: start_ns and end_ns (ns since 1970), time_us, and algbw_gbs
// (bytes / time in GB/s; absent for an empty or instant record).
func AppendTimes(b []byte, start, end time.Time, bytes int64) []byte {
	b = append(b, `,"start_ns":`...)
	b = strconv.AppendInt(b, start.UnixNano(), 10)
	b = append(b, `,"end_ns":`...)
	b = strconv.AppendInt(b, end.UnixNano(), 10)
	d := end.Sub(start)
	b = append(b, `,"time_us":`...)
	b = strconv.AppendFloat(b, float64(d)/1e3, 'f', 3, 64)
	if d > 0 && bytes > 0 {
		if bw := float64(bytes) / d.Seconds() / 1e9; !math.IsInf(bw, 0) && !math.IsNaN(bw) {
			b = append(b, `,"algbw_gbs":`...)
			b = strconv.AppendFloat(b, bw, 'f', 4, 64)
		}
	}
	return b
}
