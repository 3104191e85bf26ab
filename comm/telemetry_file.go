package comm

import (
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// The telemetry file: with Config.TelemetryFile or GCCL_TELEMETRY_FILE set,
// a Comm writes one JSON line per operation it runs, like NCCL's inspector
// plugin. The operation only publishes its record in the ring
// (telemetry.go); a goroutine of the Comm, started by its first operation
// and stopped by Close, drains the ring to the file: every 100 ms, and
// whenever a quarter of the ring has filled since it last looked. Should
// it fall a whole ring behind (a stalled disk), it skips what was
// overwritten and counts it in Stats.Dropped.

// telFlushEvery is how long a record may wait for the writer.
const telFlushEvery = 100 * time.Millisecond

// expandTelemetryPath replaces %r with the rank, %p with the process ID, %h
// with the host name and %% with %, so that one setting serves every rank
// of a job.
func expandTelemetryPath(pattern string, rank int) string {
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
			b.WriteString(strconv.Itoa(rank))
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

// telWriter drains a Comm's ring into its file.
type telWriter struct {
	c      *Comm
	f      *os.File
	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}
	next   uint64 // the next record to write
	buf    []byte
	failed bool // a write failed: logged once, nothing more written
}

// telNotify is telEnd's: start the writer with the first record, and wake
// it when a quarter of the ring has filled. It allocates only once.
func (c *Comm) telNotify(n uint64) {
	w := c.tel.w.Load()
	if w == nil {
		if w = c.telStart(); w == nil {
			return
		}
	}
	if n%(TelemetryRing/4) == 0 {
		select {
		case w.wake <- struct{}{}:
		default: // already awake, or about to be
		}
	}
}

// telStart opens the telemetry file and starts its writer, unless Close
// came first or the file cannot be opened (logged; the Comm then writes
// none).
func (c *Comm) telStart() *telWriter {
	t := &c.tel
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if w := t.w.Load(); w != nil || t.stopped {
		return w
	}
	name := expandTelemetryPath(t.file, c.rank)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		c.log.Warn("telemetry file not written", "subsys", "INIT", "err", err)
		t.stopped = true
		return nil
	}
	w := &telWriter{c: c, f: f, wake: make(chan struct{}, 1), stop: make(chan struct{}),
		exited: make(chan struct{}), next: 1}
	t.w.Store(w)
	go w.run()
	return w
}

// telClose writes what is left and closes the file (Close).
func (c *Comm) telClose() {
	t := &c.tel
	t.wmu.Lock()
	t.stopped = true
	w := t.w.Load()
	t.wmu.Unlock()
	if w != nil {
		close(w.stop)
		<-w.exited
	}
}

func (w *telWriter) run() {
	defer close(w.exited)
	tick := time.NewTicker(telFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			w.drain()
			if err := w.f.Close(); err != nil && !w.failed {
				w.c.log.Warn("telemetry file", "subsys", "INIT", "err", err)
			}
			return
		case <-w.wake:
		case <-tick.C:
		}
		w.drain()
	}
}

// drain writes every record published since the last drain.
func (w *telWriter) drain() {
	t := &w.c.tel
	var r OpRecord
	w.buf = w.buf[:0]
	for n := t.n.Load(); w.next <= n; {
		if !t.read(w.next, &r) {
			// Overwritten: skip to what the ring still holds, with a
			// margin for the writer going on meanwhile.
			lo := max(t.n.Load(), TelemetryRing) - TelemetryRing + 1 + TelemetryRing/8
			lo = max(lo, w.next+1)
			t.dropped.Add(lo - w.next)
			w.next = lo
			n = t.n.Load()
			continue
		}
		w.buf = w.c.appendRecordJSON(w.buf, &r)
		w.next++
		if len(w.buf) >= 64<<10 {
			w.flush()
		}
	}
	w.flush()
}

func (w *telWriter) flush() {
	if len(w.buf) == 0 || w.failed {
		w.buf = w.buf[:0]
		return
	}
	if _, err := w.f.Write(w.buf); err != nil {
		w.failed = true
		w.c.log.Warn("telemetry file: writing stopped", "subsys", "INIT", "err", err)
	}
	w.buf = w.buf[:0]
}

// appendRecordJSON appends r as one JSON line. The fields:
//
//	rank, size, comm   this rank, the Comm's size, its job ID (empty for InitLocal)
//	n, seq             OpRecord.N and Seq
//	kind, bytes, type  OpRecord.Kind, Bytes, Type
//	op, root           a reduction's op, a rooted collective's root (else absent)
//	path, algo         OpRecord.Path, Algorithm (absent when none)
//	transport          OpRecord.Transport
//	start_ns, end_ns   OpRecord.Start and End, ns since 1970
//	time_us            End - Start in µs
//	algbw_gbs          bytes / time, in GB/s (absent for an empty or instant op)
//	failed             present (true) only for a failed operation
//	last_rank          present only once known (Stragglers)
func (c *Comm) appendRecordJSON(b []byte, r *OpRecord) []byte {
	b = append(b, `{"rank":`...)
	b = strconv.AppendInt(b, int64(c.rank), 10)
	b = append(b, `,"size":`...)
	b = strconv.AppendInt(b, int64(c.size), 10)
	b = append(b, `,"comm":`...)
	b = strconv.AppendQuote(b, c.jobID)
	b = append(b, `,"n":`...)
	b = strconv.AppendUint(b, r.N, 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"kind":`...)
	b = strconv.AppendQuote(b, r.Kind)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, r.Bytes, 10)
	b = append(b, `,"type":`...)
	b = strconv.AppendQuote(b, r.Type.String())
	if r.Op != 0 {
		b = append(b, `,"op":`...)
		b = strconv.AppendQuote(b, Op{Kind: r.Op}.String())
	}
	if r.Root != 0 {
		b = append(b, `,"root":`...)
		b = strconv.AppendInt(b, int64(r.Root), 10)
	}
	b = append(b, `,"path":`...)
	b = strconv.AppendQuote(b, r.Path)
	if r.Algorithm != "" {
		b = append(b, `,"algo":`...)
		b = strconv.AppendQuote(b, r.Algorithm)
	}
	b = append(b, `,"transport":`...)
	b = strconv.AppendQuote(b, r.Transport)
	b = append(b, `,"start_ns":`...)
	b = strconv.AppendInt(b, r.Start.UnixNano(), 10)
	b = append(b, `,"end_ns":`...)
	b = strconv.AppendInt(b, r.End.UnixNano(), 10)
	d := r.Duration()
	b = append(b, `,"time_us":`...)
	b = strconv.AppendFloat(b, float64(d)/1e3, 'f', 3, 64)
	if d > 0 && r.Bytes > 0 {
		bw := float64(r.Bytes) / d.Seconds() / 1e9
		if !math.IsInf(bw, 0) && !math.IsNaN(bw) {
			b = append(b, `,"algbw_gbs":`...)
			b = strconv.AppendFloat(b, bw, 'f', 4, 64)
		}
	}
	if r.Failed {
		b = append(b, `,"failed":true`...)
	}
	if r.LastRank >= 0 {
		b = append(b, `,"last_rank":`...)
		b = strconv.AppendInt(b, int64(r.LastRank), 10)
	}
	return append(b, "}\n"...)
}
