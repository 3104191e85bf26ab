package comm

import "slices"

// Calls on StreamBuffers (device.go) are ordered on the buffers' streams:
// issue and issueAsync hold every stream of a call's buffers once the call
// is valid, run waits for the work queued before the holds and releases
// them when the call ends, however it ends, so a stream never waits for a
// call that will not complete.

// holdStreams holds the streams of cl's StreamBuffers. Host calls and
// calls on other device buffers hold nothing and allocate nothing, and
// neither does a call refused: holding a stream and then releasing it
// would not be harmless, since a stream held makes whatever synchronizes
// the device (another rank's cudaFree) wait until it is released.
func (c *Comm) holdStreams(cl *call) error {
	if !cl.hasDevice() || cl.path == pathDeviceFlags {
		return nil // stream-ordered calls queue their work on the stream itself
	}
	var bound, unbound int
	for db := range cl.deviceBuffers {
		if _, ok := db.(StreamBuffer); ok {
			bound++
		} else {
			unbound++
		}
	}
	if bound == 0 {
		return nil
	}
	var err error
	if unbound > 0 {
		err = invalid("the call's device buffers are bound to streams but %d of them is not (bind them all, or none)", unbound)
	}
	var heldSpace [2]uintptr
	held := heldSpace[:0] // the streams held, by StreamBuffer.Stream
	for db := range cl.deviceBuffers {
		if err != nil {
			break
		}
		sb := db.(StreamBuffer)
		if slices.Contains(held, sb.Stream()) {
			continue
		}
		var h StreamHold
		if h, err = sb.HoldStream(); err == nil {
			cl.holds.add(h)
			held = append(held, sb.Stream())
		}
	}
	if err != nil {
		cl.releaseStreams()
		return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: err}
	}
	return nil
}

// deviceBuffers yields the device buffers of cl.
func (cl *call) deviceBuffers(yield func(DeviceBuffer) bool) {
	if cl.isGroup {
		for i := range cl.group {
			if db := cl.group[i].v.dev; db != nil && !yield(db) {
				return
			}
		}
		return
	}
	if cl.in.dev != nil && !yield(cl.in.dev) {
		return
	}
	if cl.out.dev != nil {
		yield(cl.out.dev)
	}
}

// streamsReady waits for the work queued on cl's held streams before it.
func (cl *call) streamsReady() error {
	for i := range cl.holds.n {
		if err := cl.holds.at(i).Ready(); err != nil {
			return err
		}
	}
	return nil
}

// releaseStreams lets cl's held streams run on.
func (cl *call) releaseStreams() {
	for i := range cl.holds.n {
		cl.holds.at(i).Release()
	}
	cl.holds = streamHolds{}
}

// streamHolds are the streams a call holds: two in place (a call's send and
// receive buffers' streams), more only for groups, so that a blocking call
// on stream-bound buffers allocates nothing for them.
type streamHolds struct {
	first [2]StreamHold
	more  []StreamHold
	n     int
}

func (s *streamHolds) add(h StreamHold) {
	if s.n < len(s.first) {
		s.first[s.n] = h
	} else {
		s.more = append(s.more, h)
	}
	s.n++
}

func (s *streamHolds) at(i int) StreamHold {
	if i < len(s.first) {
		return s.first[i]
	}
	return s.more[i-len(s.first)]
}
