package ibverbs

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

func TestGeometry(t *testing.T) {
	g, err := newGeometry(512<<10, 4, 2)
	require.NoError(t, err)
	require.Equal(t, hdrSize+512<<10, g.stride)
	require.Equal(t, 0, g.recvOff(0))
	require.Equal(t, 3*g.stride, g.recvOff(3))
	require.Equal(t, 4*g.stride, g.sendOff(0))
	require.Equal(t, 8*g.stride, g.ctrlOff())
	require.Equal(t, 8*g.stride+ctrlSize, g.bytes())
	require.LessOrEqual(t, ctrlReasonSrc+reasonMax, ctrlSize)

	// Odd slot sizes round the stride up to a cache line.
	g, err = newGeometry(1000, 3, 1)
	require.NoError(t, err)
	require.Equal(t, hdrSize+1024, g.stride)
	require.Zero(t, g.stride%lineSize)

	for _, bad := range [][3]int{{0, 4, 1}, {1 << 20, 1, 1}, {1 << 20, 1<<16 + 1, 1}, {1 << 20, 4, 0}, {1 << 20, 4, MaxQPs + 1}} {
		_, err := newGeometry(bad[0], bad[1], bad[2])
		require.Error(t, err, "%v", bad)
	}
}

// The pieces of a message cover the header and every byte exactly once,
// on page boundaries, and only large messages are striped.
func TestPieces(t *testing.T) {
	for _, qps := range []int{1, 2, 3, 4, MaxQPs} {
		g, err := newGeometry(4<<20, 4, qps)
		require.NoError(t, err)
		for _, n := range []int{0, 1, 63, 4096, stripeMin - 1, stripeMin, stripeMin + 1, 1<<20 + 3, 4 << 20} {
			parts := g.pieces(n)
			if n < stripeMin || qps == 1 {
				require.Equal(t, 1, parts, "n=%d qps=%d", n, qps)
			} else {
				require.Equal(t, qps, parts, "n=%d qps=%d", n, qps)
			}
			next := 0
			for j := range parts {
				off, length := g.piece(n, parts, j)
				require.Equal(t, next, off, "n=%d qps=%d piece %d", n, qps, j)
				require.Positive(t, length, "n=%d qps=%d piece %d is empty", n, qps, j)
				if j > 0 {
					require.Zero(t, (off-hdrSize)%stripeAlign, "piece %d of %d bytes starts off a page", j, n)
				}
				next = off + length
			}
			require.Equal(t, hdrSize+n, next, "n=%d qps=%d: the pieces do not end at the message's end", n, qps)
			require.LessOrEqual(t, next, g.stride)
		}
	}
}

func TestHeader(t *testing.T) {
	b := make([]byte, hdrSize)
	putHeader(b, 123456, 1<<33+7, 0xdeadbeefcafe, 1<<40+3)
	n, seq, tag := header(b)
	require.Equal(t, 123456, n)
	require.Equal(t, uint32(7), seq)
	require.Equal(t, uint64(0xdeadbeefcafe), tag)
	require.Equal(t, uint64(1<<40+3), hdrCredit(b))
	require.LessOrEqual(t, hdrUsed, hdrSize)
}

func TestImmediates(t *testing.T) {
	for _, parts := range []int{1, 2, MaxQPs} {
		for _, seq := range []uint64{0, 1, seqMask, seqMask + 1, 1<<40 + 5} {
			k, v := splitImm(dataImm(seq, parts))
			require.Equal(t, immData, k)
			p, low := splitData(v)
			require.Equal(t, parts, p)
			require.Equal(t, uint32(seq&seqMask), low)
		}
	}
	for _, k := range []immKind{immCredit, immClose, immAbort} {
		kk, v := splitImm(makeImm(k, 1<<31+12345))
		require.Equal(t, k, kk)
		require.Equal(t, uint32((1<<31+12345)&valMask), v)
	}
	// advance rebuilds a counter from its low bits, across the wrap.
	for _, c := range []struct {
		cur  uint64
		next uint64
	}{{0, 0}, {0, 5}, {seqMask - 2, seqMask + 3}, {1<<40 + seqMask, 1<<40 + seqMask + 65536}} {
		require.Equal(t, c.next-c.cur, advance(c.cur, uint32(c.next&seqMask), seqBits), "%+v", c)
		require.Equal(t, c.next-c.cur, advance(c.cur, uint32(c.next&valMask), valBits), "%+v", c)
	}
}

func TestWRID(t *testing.T) {
	for _, k := range []wrKind{wrRecv, wrData, wrCtl} {
		for _, q := range []int{0, 1, MaxQPs - 1} {
			for _, p := range []int{0, 1, 1 << 20, 1<<31 - 1} {
				kk, qq, pp := splitWRID(makeWRID(k, q, p))
				require.Equal(t, []int{int(k), q, p}, []int{int(kk), qq, pp})
			}
		}
	}
}

func TestPortAddr(t *testing.T) {
	gid, err := verbs.ParseGID("::ffff:169.254.77.1")
	require.NoError(t, err)
	a := portAddr{Device: "mlx5_0", Port: 1, LinkLayer: verbs.LinkEthernet, GIDType: verbs.GIDRoCEv2, GIDIndex: 3,
		GID: gid, LID: 0, MTU: verbs.MTU4096, QPs: 2, TCP: "10.0.0.1:40000"}
	b, err := parseAddr(a.marshal())
	require.NoError(t, err)
	require.Equal(t, a, b)
	a.TCP = "" // no fallback
	b, err = parseAddr(a.marshal())
	require.NoError(t, err)
	require.Equal(t, a, b)
	a.TCP = "10.0.0.1:40000"
	require.Equal(t, "mlx5_0:1", b.Name())
	require.Equal(t, "RoCE v2", b.Fabric())
	a.LinkLayer, a.GIDType = verbs.LinkInfiniBand, verbs.GIDIB
	require.Equal(t, "InfiniBand", a.Fabric())

	good := a.marshal()
	for name, bad := range map[string][]byte{
		"empty":      nil,
		"version":    append([]byte{9}, good[1:]...),
		"truncated":  good[:len(good)-1],
		"long":       append(good, 'x'),
		"no tcp len": good[:33+len("mlx5_0")],
		"link layer": func() []byte { b := append([]byte(nil), good...); b[1] = 7; return b }(),
		"mtu":        func() []byte { b := append([]byte(nil), good...); b[6] = 0; return b }(),
		"qps":        func() []byte { b := append([]byte(nil), good...); b[7] = MaxQPs + 1; return b }(),
	} {
		_, err := parseAddr(bad)
		require.Error(t, err, name)
	}
}

func TestPairInfo(t *testing.T) {
	gid, _ := verbs.ParseGID("::ffff:10.0.0.1")
	p := pairInfo{SlotSize: 512 << 10, Count: 4, Addr: 0x7f0012340000, RKey: 0x1234,
		Endpoints: []verbs.Endpoint{
			{QPN: 0x11, PSN: 5, GID: gid, MTU: verbs.MTU1024, LinkLayer: verbs.LinkEthernet, RdAtomic: 16},
			{QPN: 0x12, PSN: 6, GID: gid, MTU: verbs.MTU1024, LinkLayer: verbs.LinkEthernet, RdAtomic: 16},
		}}
	q, err := parsePairInfo(p.marshal())
	require.NoError(t, err)
	require.Equal(t, p, q)

	f, err := parsePairInfo(pairInfo{Failed: "registering 4 MiB: cannot allocate memory"}.marshal())
	require.NoError(t, err)
	require.Equal(t, "registering 4 MiB: cannot allocate memory", f.Failed)

	good := p.marshal()
	for name, bad := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("xIB1"), good[4:]...),
		"truncated": good[:len(good)-3],
		"no qps":    func() []byte { b := append([]byte(nil), good[:32]...); b[5] = 0; return b }(),
		"endpoint":  func() []byte { b := append([]byte(nil), good...); b[32] = 99; return b }(),
	} {
		_, err := parsePairInfo(bad)
		require.Error(t, err, name)
	}
}

func TestMemlockShort(t *testing.T) {
	require.Empty(t, memlockShort(1<<30, 64<<10, true, false), "unlimited")
	require.Empty(t, memlockShort(1<<30, 64<<10, false, true), "CAP_IPC_LOCK")
	require.Empty(t, memlockShort(8<<20, 8<<20, false, false), "enough")
	why := memlockShort(12<<20, 8<<20, false, false)
	for _, want := range []string{"RLIMIT_MEMLOCK is 8388608 bytes", "need 12582912 bytes", "ulimit -l unlimited", "--ulimit memlock=-1"} {
		require.Contains(t, why, want)
	}
}

func TestOptions(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	o, err := optionsFrom(env(nil))
	require.NoError(t, err)
	require.Equal(t, DefaultQPs, o.qps)
	require.False(t, o.strict)
	o, err = optionsFrom(env(map[string]string{"GCCL_IB_QPS_PER_CONNECTION": "4", "GCCL_STRICT": "1", "GCCL_IB_TIMEOUT": "14"}))
	require.NoError(t, err)
	require.Equal(t, 4, o.qps)
	require.True(t, o.strict)
	require.Equal(t, uint8(14), o.verbs.Timeout)
	for _, bad := range []map[string]string{{"GCCL_IB_QPS_PER_CONNECTION": "0"}, {"GCCL_IB_QPS_PER_CONNECTION": "17"},
		{"GCCL_IB_QPS_PER_CONNECTION": "two"}, {"GCCL_IB_RETRY_CNT": "9"}} {
		_, err := optionsFrom(env(bad))
		require.Error(t, err, "%v", bad)
	}
}

// testConn is a connection without a device, to feed completions to.
func testConn(t *testing.T, count, qps int) *conn {
	g, err := newGeometry(256<<10, count, qps)
	require.NoError(t, err)
	e := &Endpoint{rank: 0, size: 2}
	c := &conn{e: e, peer: 1, g: g, buf: make([]byte, g.bytes()), sqData: make([]int, qps), repost: make([]int, qps),
		got: make([]uint8, count), need: make([]uint8, count)}
	e.conns = []*conn{nil, c}
	e.dirty = make([]*conn, 0, 1)
	return c
}

func recvWC(imm uint32) *verbs.WC { return &verbs.WC{Imm: imm, Flags: verbs.WCWithImm} }

// Pieces of several messages completing out of order: a message is ready
// once all its pieces came and every earlier one is ready; the counters
// travel modulo 2^25 and are rebuilt across the wrap.
func TestPiecesComplete(t *testing.T) {
	c := testConn(t, 4, 2)
	start := uint64(seqMask - 1) // the wrap falls inside the test
	c.head, c.ready = start, start
	// Message start+1 (2 pieces) completes first, then start (1 piece):
	// both become ready only then.
	c.complete(wrRecv, 1, recvWC(dataImm(start+1, 2)))
	c.complete(wrRecv, 0, recvWC(dataImm(start+1, 2)))
	require.Equal(t, start, c.ready)
	c.complete(wrRecv, 0, recvWC(dataImm(start, 1)))
	require.Equal(t, start+2, c.ready)
	require.NoError(t, c.err)
	require.Equal(t, []int{2, 1}, c.repost)
	require.True(t, c.dirty)

	// A message beyond the ring (the sender ignored its credits) is a
	// protocol error, not a silent overwrite.
	c.complete(wrRecv, 0, recvWC(dataImm(start+4, 1)))
	var pe *transport.PeerError
	require.ErrorAs(t, c.err, &pe)
	require.Equal(t, 1, pe.Peer)
	require.Contains(t, c.err.Error(), "may arrive")

	// Pieces that disagree on their count.
	c = testConn(t, 4, 2)
	c.complete(wrRecv, 0, recvWC(dataImm(0, 2)))
	c.complete(wrRecv, 1, recvWC(dataImm(0, 1)))
	require.ErrorContains(t, c.err, "does not add up")
}

// Credits move the sender's window; stale or excessive ones are refused.
func TestCreditArithmetic(t *testing.T) {
	c := testConn(t, 4, 1)
	c.tail = 3
	c.complete(wrRecv, 0, recvWC(makeImm(immCredit, 2)))
	require.Equal(t, uint64(2), c.credit)
	require.True(t, c.canSend(10))
	c.tail = 6
	require.False(t, c.canSend(10), "4 messages in flight on a 4-slot ring")
	c.complete(wrRecv, 0, recvWC(makeImm(immCredit, 6)))
	require.Equal(t, uint64(6), c.credit)
	require.True(t, c.canSend(10))
	// Room on the QP counts too.
	c.sqData[0] = 4
	require.False(t, c.canSend(10))
	c.complete(wrData, 0, &verbs.WC{})
	require.True(t, c.canSend(10))
	require.NoError(t, c.err)
	// An explicit credit behind one that came in a header is ignored.
	c.complete(wrRecv, 0, recvWC(makeImm(immCredit, 5)))
	require.Equal(t, uint64(6), c.credit)
	require.NoError(t, c.err)
	c.complete(wrRecv, 0, recvWC(makeImm(immCredit, 9)))
	require.ErrorContains(t, c.err, "credit for 3 messages, 0 are in flight")

	// Credits ride in the header of the messages of the other direction.
	c = testConn(t, 4, 1)
	c.tail = 3
	putHeader(c.buf[c.g.recvOff(0):], 8, 0, 1, 2)
	c.complete(wrRecv, 0, recvWC(dataImm(0, 1)))
	require.Equal(t, uint64(2), c.credit)
	require.Equal(t, uint64(1), c.ready)
	putHeader(c.buf[c.g.recvOff(1):], 8, 1, 1, 1) // an older credit: ignored
	c.complete(wrRecv, 0, recvWC(dataImm(1, 1)))
	require.Equal(t, uint64(2), c.credit)
	require.NoError(t, c.err)
	putHeader(c.buf[c.g.recvOff(2):], 8, 2, 1, 4) // more than was sent
	c.complete(wrRecv, 0, recvWC(dataImm(2, 1)))
	require.ErrorContains(t, c.err, "credits 4 messages, 3 were sent")
}

// The peer's notices: a close is reported once everything it sent before
// is taken; an abort carries its reason.
func TestNotices(t *testing.T) {
	c := testConn(t, 4, 1)
	c.complete(wrRecv, 0, recvWC(makeImm(immClose, 1)))
	require.NoError(t, c.rxErr(), "message 0 is still on its way")
	require.ErrorIs(t, c.txErr(), transport.ErrPeerClosed)
	c.complete(wrRecv, 0, recvWC(dataImm(0, 1)))
	require.Equal(t, uint64(1), c.ready)
	require.ErrorIs(t, c.rxErr(), transport.ErrPeerClosed)

	c = testConn(t, 4, 1)
	copy(c.buf[c.g.ctrlOff()+ctrlReason:], "rank 3 hit an error")
	c.complete(wrRecv, 0, recvWC(makeImm(immAbort, uint64(len("rank 3 hit an error")))))
	err := c.rxErr()
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	require.ErrorContains(t, err, "rank aborted: rank 3 hit an error")
	var pe *transport.PeerError
	require.ErrorAs(t, c.txErr(), &pe)
	require.Equal(t, 1, pe.Peer)
}

// A failed work completion names the HCA, the QP, the pair and the status,
// and counts as a lost peer when the peer stopped answering.
func TestFailedCompletion(t *testing.T) {
	c := testConn(t, 4, 1)
	c.e.port = verbs.Port{Device: "mlx5_0", Num: 1}
	c.failWC(wrData, &verbs.WC{Status: verbs.WCRetryExcErr, QPNum: 0x1a2})
	for _, want := range []string{"NET/IB/mlx5_0:1", "QP 0x1a2", "rank 0 -> 1", "transport retry counter exceeded", "RDMA write of a message"} {
		require.ErrorContains(t, c.err, want)
	}
	require.ErrorIs(t, c.err, transport.ErrPeerClosed)
	var pe *transport.PeerError
	require.ErrorAs(t, c.err, &pe)
	require.Equal(t, 1, pe.Peer)

	c = testConn(t, 4, 1)
	c.e.port = verbs.Port{Device: "mlx5_0", Num: 1}
	c.failWC(wrRecv, &verbs.WC{Status: verbs.WCRemAccessErr, QPNum: 0x1a2})
	require.ErrorContains(t, c.err, "remote access error")
	require.NotErrorIs(t, c.err, transport.ErrPeerClosed)
}
