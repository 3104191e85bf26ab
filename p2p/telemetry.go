package p2p

import (
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/gccl/gccl/internal/records"
)

// Telemetry: every post an agent finishes leaves a record (XferRecord) in a
// ring of the latest TelemetryRing records and adds to per-backend totals;
// Stats reads both. With Config.TelemetryFile (or GCCL_TELEMETRY_FILE) set,
// a goroutine started by the first record and stopped by Close writes them
// as JSON lines. Recording takes the agent's telemetry lock for a few
// stores and allocates nothing.

// TelemetryRing is how many of an agent's latest transfers Stats reports.
const TelemetryRing = 1024

// LatencyBuckets and LatencyBounds are the latency histogram of
// BackendTotals: 1 µs to about 17 s by powers of four, then the rest.
const LatencyBuckets = records.LatencyBuckets

// LatencyBounds are the buckets' upper bounds.
var LatencyBounds = records.LatencyBounds

// XferRecord is one post of a request, finished.
type XferRecord struct {
	// N numbers the agent's records from 1: a gap means lost records.
	N uint64
	// ID is the post's ID (what Cancel and the target's logs name).
	ID      uint64
	Op      Op
	Peer    string // the target agent (this agent's own name for a local copy)
	Backend Backend
	Bytes   uint64
	Parts   int // parts posted (notifications the target gets, at most)
	// PartsDone is how many parts completed: Parts unless it failed.
	PartsDone  int
	Start, End time.Time
	Failed     bool
}

// Duration is how long the post took.
func (r XferRecord) Duration() time.Duration { return r.End.Sub(r.Start) }

// BackendTotals are an agent's cumulative figures for one backend and
// direction.
type BackendTotals struct {
	Backend Backend
	Op      Op
	Xfers   uint64 // posts finished
	Failed  uint64 // of which failed
	Bytes   uint64 // bytes of the successful posts
	Time    time.Duration
	// Latency counts posts by duration, as LatencyBounds say.
	Latency [LatencyBuckets]uint64
}

// Stats is a snapshot of an agent's counters and telemetry.
type Stats struct {
	RegCache RegCacheStats // the RDMA registration cache (zero without a device)

	Name    string
	Xfers   uint64       // posts finished since New (the last record's N)
	Recent  []XferRecord // the latest, up to TelemetryRing, oldest first
	Totals  []BackendTotals
	Dropped uint64 // records the telemetry file lost (its writer a whole ring behind)
}

const maxBackends = 16

type agentTelemetry struct {
	mu      sync.Mutex
	ring    [TelemetryRing]XferRecord
	n       uint64
	totals  [maxBackends][2]BackendTotals // by backend, op-1
	dropped uint64

	file    string // unexpanded
	w       *xferWriter
	stopped bool
}

func (a *Agent) initTelemetry() {
	a.tel.file = a.cfg.TelemetryFile
	if a.tel.file == "" {
		a.tel.file = os.Getenv("GCCL_TELEMETRY_FILE")
	}
}

// telRecord records the end of r's current post (complete).
func (a *Agent) telRecord(r *Request, err error) {
	end := time.Now()
	t := &a.tel
	t.mu.Lock()
	t.n++
	rec := &t.ring[(t.n-1)%TelemetryRing]
	*rec = XferRecord{N: t.n, ID: r.id, Op: r.op, Peer: r.peer, Backend: r.backend, Bytes: r.bytes,
		Parts: len(r.parts), PartsDone: int(r.partsDone.Load()),
		Start: time.Unix(0, r.postedAt), End: end, Failed: err != nil}
	if b, o := int(r.backend), int(r.op)-1; b < maxBackends && o >= 0 && o < 2 {
		tot := &t.totals[b][o]
		tot.Backend, tot.Op = r.backend, r.op
		tot.Xfers++
		if err != nil {
			tot.Failed++
		} else {
			tot.Bytes += r.bytes
		}
		d := rec.Duration()
		tot.Time += d
		tot.Latency[records.Bucket(d)]++
	}
	n := t.n
	w := t.w
	start := w == nil && t.file != "" && !t.stopped
	t.mu.Unlock()
	if start {
		a.telStart()
	} else if w != nil && n%(TelemetryRing/4) == 0 {
		w.file.Wake()
	}
}

// Stats returns a snapshot of the agent's counters and telemetry. It is safe to call
// from any goroutine, at any time (also after Close).
func (a *Agent) Stats() Stats {
	t := &a.tel
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Stats{Name: a.name, Xfers: t.n, Dropped: t.dropped}
	if a.rdma != nil {
		st.RegCache = a.rdma.cache.stats()
	}
	first := uint64(1)
	if t.n > TelemetryRing {
		first = t.n - TelemetryRing + 1
	}
	st.Recent = make([]XferRecord, 0, t.n-first+1)
	for i := first; i <= t.n; i++ {
		st.Recent = append(st.Recent, t.ring[(i-1)%TelemetryRing])
	}
	for b := range t.totals {
		for o := range t.totals[b] {
			if t.totals[b][o].Xfers > 0 {
				st.Totals = append(st.Totals, t.totals[b][o])
			}
		}
	}
	return st
}

// The telemetry file (internal/records runs the writer).

type xferWriter struct {
	a    *Agent
	file *records.Writer
	next uint64
	recs []XferRecord
	buf  []byte
}

func (a *Agent) telStart() {
	t := &a.tel
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w != nil || t.stopped {
		return
	}
	w := &xferWriter{a: a, next: 1}
	warn := func(msg string, err error) { a.log.Warn("p2p "+msg, "err", err) }
	f, err := records.Open(records.ExpandPath(t.file, a.name), w.drain, warn)
	if err != nil {
		a.log.Warn("p2p telemetry file not written", "err", err)
		t.stopped = true
		return
	}
	w.file = f
	t.w = w
}

// telClose writes what is left and closes the file (Close).
func (a *Agent) telClose() {
	t := &a.tel
	t.mu.Lock()
	t.stopped = true
	w := t.w
	t.mu.Unlock()
	if w != nil {
		w.file.Close()
	}
}

// drain copies the new records out under the lock, then writes them.
func (w *xferWriter) drain(f *records.Writer) {
	t := &w.a.tel
	t.mu.Lock()
	if t.n >= TelemetryRing && w.next < t.n-TelemetryRing+1 {
		lost := t.n - TelemetryRing + 1 - w.next
		t.dropped += lost
		w.next += lost
	}
	w.recs = w.recs[:0]
	for ; w.next <= t.n; w.next++ {
		w.recs = append(w.recs, t.ring[(w.next-1)%TelemetryRing])
	}
	t.mu.Unlock()
	w.buf = w.buf[:0]
	for i := range w.recs {
		w.buf = appendXferJSON(w.buf, w.a.name, &w.recs[i])
	}
	f.Write(w.buf)
}

// appendXferJSON appends r as one JSON line: agent, n, id, op ("READ",
// "WRITE"), peer, backend, bytes, parts, parts_done, start_ns, end_ns,
// time_us, algbw_gbs (absent for an instant post), failed (only when true).
func appendXferJSON(b []byte, agent string, r *XferRecord) []byte {
	b = append(b, `{"agent":`...)
	b = strconv.AppendQuote(b, agent)
	b = append(b, `,"n":`...)
	b = strconv.AppendUint(b, r.N, 10)
	b = append(b, `,"id":`...)
	b = strconv.AppendUint(b, r.ID, 10)
	b = append(b, `,"op":`...)
	b = strconv.AppendQuote(b, r.Op.String())
	b = append(b, `,"peer":`...)
	b = strconv.AppendQuote(b, r.Peer)
	b = append(b, `,"backend":`...)
	b = strconv.AppendQuote(b, r.Backend.String())
	b = append(b, `,"bytes":`...)
	b = strconv.AppendUint(b, r.Bytes, 10)
	b = append(b, `,"parts":`...)
	b = strconv.AppendInt(b, int64(r.Parts), 10)
	b = append(b, `,"parts_done":`...)
	b = strconv.AppendInt(b, int64(r.PartsDone), 10)
	b = records.AppendTimes(b, r.Start, r.End, int64(r.Bytes))
	if r.Failed {
		b = append(b, `,"failed":true`...)
	}
	return append(b, "}\n"...)
}
