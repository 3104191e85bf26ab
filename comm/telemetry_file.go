package comm

import (
	"strconv"

	"github.com/gccl/gccl/internal/records"
)

// The telemetry file: with Config.TelemetryFile or GCCL_TELEMETRY_FILE set,
// a Comm writes one JSON line per operation it runs, like NCCL's inspector
// plugin. The operation only publishes its record in the ring
// (telemetry.go); a goroutine of the Comm, started by its first operation
// and stopped by Close, drains the ring to the file: every 100 ms, and
// whenever a quarter of the ring has filled since it last looked. Should
// it fall a whole ring behind (a stalled disk), it skips what was
// overwritten and counts it in Stats.Dropped.

// telWriter drains a Comm's ring into its file (internal/telemetry runs
// it).
type telWriter struct {
	c    *Comm
	file *records.Writer
	next uint64 // the next record to write
	buf  []byte
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
		w.file.Wake()
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
	w := &telWriter{c: c, next: 1}
	warn := func(msg string, err error) { c.log.Warn(msg, "subsys", "INIT", "err", err) }
	f, err := records.Open(records.ExpandPath(t.file, strconv.Itoa(c.rank)), w.drain, warn)
	if err != nil {
		c.log.Warn("telemetry file not written", "subsys", "INIT", "err", err)
		t.stopped = true
		return nil
	}
	w.file = f
	t.w.Store(w)
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
		w.file.Close()
	}
}

// drain writes every record published since the last drain.
func (w *telWriter) drain(f *records.Writer) {
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
			f.Write(w.buf)
			w.buf = w.buf[:0]
		}
	}
	f.Write(w.buf)
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
	b = records.AppendTimes(b, r.Start, r.End, r.Bytes)
	if r.Failed {
		b = append(b, `,"failed":true`...)
	}
	if r.LastRank >= 0 {
		b = append(b, `,"last_rank":`...)
		b = strconv.AppendInt(b, int64(r.LastRank), 10)
	}
	return append(b, "}\n"...)
}
