package comm

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/gccl/gccl/internal/clock"
)

// arrivalLog is how many of a Comm's latest collectives Stragglers can
// report on.
const arrivalLog = 64

// arrival is when this rank reached one collective: when it starts running
// it, whichever path it then takes (an async call when the progress
// goroutine starts it, not when it was issued).
type arrival struct {
	seq uint64
	op  string
	at  int64 // wall clock, ns since 1970, comparable between processes
	// at on clock.Read's line, from which the operation's record is timed.
	line int64
}

// arrive marks the collective seq as reached, for the watchdog and for
// Stragglers, once per collective (runHeld). It is on every collective's
// path: no allocation, no lock (one goroutine runs the Comm's operations at
// a time).
func (c *Comm) arrive(seq uint64, op string) {
	c.reached.Store(seq)
	line, off := clock.Read()
	c.arrivals[seq%arrivalLog] = arrival{seq: seq, op: op, at: line + off, line: line}
}

// Straggle is one collective's arrival spread: which rank reached it last,
// and how long after the first.
type Straggle struct {
	Op    string
	Seq   uint64 // the collective's sequence number on the Comm
	First int    // the rank that arrived first
	Last  int    // the rank that arrived last: the one the others waited for
	Late  time.Duration
}

// Stragglers reports, for each of the Comm's latest collectives (up to 64)
// that every rank reached, which rank arrived last and how late: the
// per-operation straggler report of a job that runs slower than it should.
// It is collective: every rank calls it, at the same point, and every rank
// gets the same report, oldest first. Arrival times are read from each
// host's wall clock, so across hosts their precision is that of the hosts'
// clock synchronization (NTP: about a millisecond; PTP: microseconds);
// within a host they are exact.
func (c *Comm) Stragglers(ctx context.Context) ([]Straggle, error) {
	if c.async.pending() > 0 {
		// The log is written by the progress goroutine meanwhile. Numbered
		// as the all-gather it skips, so that the peers' call fails too.
		if err := c.enter(); err != nil {
			return nil, err
		}
		defer c.leave()
		return nil, c.rejected("Stragglers", invalid("async operations are still running: wait for them first"))
	}
	// A copy: the all-gather below logs its own arrival, over the oldest
	// entry, which the report must still cover.
	logged := c.arrivals
	mine := make([]int64, 2*arrivalLog)
	for i, a := range logged {
		mine[2*i], mine[2*i+1] = int64(a.seq), a.at
	}
	all := make([]int64, c.size*len(mine))
	if err := AllGather(ctx, c, mine, all); err != nil {
		return nil, err
	}
	var out []Straggle
	for i, a := range logged {
		if a.seq == 0 {
			continue
		}
		s := Straggle{Op: a.op, Seq: a.seq}
		var first, last int64
		everyone := true
		for r := range c.size {
			seq, at := all[r*len(mine)+2*i], all[r*len(mine)+2*i+1]
			if uint64(seq) != a.seq {
				everyone = false // a rank has not reached it, or never will
				break
			}
			if r == 0 || at < first {
				first, s.First = at, r
			}
			if r == 0 || at > last {
				last, s.Last = at, r
			}
		}
		if everyone {
			s.Late = time.Duration(last - first)
			out = append(out, s)
			c.telSetLast(s.Seq, s.Last)
		}
	}
	slices.SortFunc(out, func(a, b Straggle) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}
