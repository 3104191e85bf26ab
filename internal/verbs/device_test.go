//go:build linux && cgo

// The tests of the device objects against a real verbs stack. On a host
// without an RDMA device they skip; tests/rxe/run.sh runs them inside a
// VM with Soft-RoCE (rdma_rxe) on the real rdma-core and kernel verbs.

package verbs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/testutil"
)

var selected struct {
	once sync.Once
	cand Candidate
	cfg  Config
	log  string
	err  error
}

// device opens the device port Select picks here, or skips the test
// (fails it under GCCL_TEST_REQUIRE_RDMA=1, as tests/rxe sets).
// Select runs once per test binary: it reads the port's whole GID table
// from sysfs, which takes seconds in the emulated VM.
func device(t *testing.T) (*Context, Port, Config) {
	t.Helper()
	s := &selected
	s.once.Do(func() {
		if s.cfg, s.err = ConfigFromEnv(); s.err != nil {
			return
		}
		var log testutil.SyncBuffer
		s.cand, s.err = Select(s.cfg, Near{NUMA: -1}, logx.New(&log, "INFO", ""))
		s.log = log.String()
	})
	if errors.Is(s.err, ErrNotSupported) {
		if os.Getenv("GCCL_TEST_REQUIRE_RDMA") == "1" {
			t.Fatalf("GCCL_TEST_REQUIRE_RDMA=1, but: %v", s.err)
		}
		t.Skipf("no RDMA device here (%v); tests/rxe/run.sh runs this test in a Soft-RoCE VM", s.err)
	}
	require.NoError(t, s.err)
	require.Contains(t, s.log, "INFO NET NET/IB : Using "+s.cand.Name()+"/")
	ctx, err := Open(s.cand.Device)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctx.Close()) })
	port, err := ctx.CandidatePort(s.cand)
	require.NoError(t, err)
	return ctx, port, s.cfg
}

// loop is two RC QPs of one device connected to each other (rxe loops
// their packets back), each with a registered buffer, sharing a CQ.
type loop struct {
	ctx    *Context
	port   Port
	cfg    Config
	pd     *PD
	cq     *CQ
	qa, qb *QP
	a, b   []byte
	ma, mb *MR
	wcs    []WC
}

const loopSize = 1 << 20

func newLoop(t *testing.T, o QPOptions) *loop {
	t.Helper()
	ctx, port, cfg := device(t)
	l := &loop{ctx: ctx, port: port, cfg: cfg, wcs: make([]WC, 16)}
	var err error
	l.pd, err = ctx.AllocPD()
	require.NoError(t, err)
	l.cq, err = ctx.CreateCQ(512, true)
	require.NoError(t, err)
	l.a, l.b = make([]byte, loopSize), make([]byte, loopSize)
	l.ma, err = l.pd.Register(l.a, AccessAll)
	require.NoError(t, err)
	l.mb, err = l.pd.Register(l.b, AccessAll)
	require.NoError(t, err)
	o.Port, o.SendCQ, o.RecvCQ = port, l.cq, l.cq
	l.qa, err = l.pd.CreateQP(o)
	require.NoError(t, err)
	l.qb, err = l.pd.CreateQP(o)
	require.NoError(t, err)
	require.Equal(t, QPInit, l.qa.State())
	require.NoError(t, l.qa.Connect(l.qb.Endpoint(), cfg))
	require.NoError(t, l.qb.Connect(l.qa.Endpoint(), cfg))
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{l.qa, l.qb, l.ma, l.mb, l.cq, l.pd} {
			require.NoError(t, c.Close())
		}
	})
	return l
}

// wait returns the next n completions, failing t on an error status.
func (l *loop) wait(t *testing.T, n int) []WC {
	t.Helper()
	var got []WC
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n {
		k, err := l.cq.Wait(l.wcs[:min(n-len(got), len(l.wcs))], deadline)
		require.NoError(t, err)
		for _, wc := range l.wcs[:k] {
			require.NoError(t, l.cq.Check(&wc))
			got = append(got, wc)
		}
	}
	return got
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func TestDeviceAndPort(t *testing.T) {
	ctx, port, _ := device(t)
	names, err := DeviceNames()
	require.NoError(t, err)
	require.Contains(t, names, ctx.Name())
	devs, err := Devices()
	require.NoError(t, err)
	var sys []string
	var info PortInfo
	for _, d := range devs {
		sys = append(sys, d.Name)
		if d.Name == ctx.Name() {
			info = d.Ports[0]
		}
	}
	require.ElementsMatch(t, names, sys, "libibverbs and sysfs list different devices")

	a := ctx.Attr()
	t.Logf("%s: %+v", ctx.Name(), a)
	require.GreaterOrEqual(t, a.Ports, 1)
	require.Greater(t, a.MaxQPWR, 0)
	require.Greater(t, a.MaxSGE, 0)
	require.Greater(t, a.MaxCQE, 0)
	require.Greater(t, a.MaxQPRdAtom, 0)

	p := port.Attr
	t.Logf("port %d: %+v, %v", port.Num, p, port.GID)
	require.Equal(t, PortActive, p.State)
	require.Equal(t, info.LinkLayer, p.LinkLayer, "ibv_query_port's link layer differs from sysfs")
	require.Equal(t, info.LID, p.LID)
	require.NotZero(t, p.ActiveMTU.Bytes())
	require.GreaterOrEqual(t, p.MaxMTU, p.ActiveMTU)
	require.Greater(t, p.GIDTableLen, port.GID.Index)
	if p.LinkLayer == LinkEthernet {
		require.Equal(t, GIDRoCEv2, port.GID.Type)
		require.True(t, port.GID.GID.IPv4Mapped(), "%v", port.GID)
	}
	if want := os.Getenv("RXEVM_GIDX"); want != "" {
		require.Equal(t, want, strconv.Itoa(port.GID.Index), "the rxe VM's set-up found another RoCE v2 IPv4 GID")
	}
	// Context.Port chooses as Select did.
	same, err := ctx.Port(port.Num, DefaultConfig())
	require.NoError(t, err)
	require.Equal(t, port, same)
	t.Log(selected.log)
	// GCCL_IB_GID_INDEX forces another populated index.
	other := info.GIDs[0]
	cfg := DefaultConfig()
	cfg.GIDIndex = other.Index
	forced, err := ctx.Port(port.Num, cfg)
	require.NoError(t, err)
	require.Equal(t, other, forced.GID)
	_, err = ctx.QueryPort(0)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// The attributes the device holds after Connect are the ones gccl meant
// to set: ibv_qp_attr is written by modify and read back by query through
// libibverbs, so a field at a wrong offset shows here.
func TestQPAttributesOnDevice(t *testing.T) {
	ctx, port, _ := device(t)
	cfg := DefaultConfig()
	cfg.Timeout, cfg.RetryCnt, cfg.TrafficClass, cfg.SL = 17, 5, 32, 0
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	cq, err := ctx.CreateCQ(16, false)
	require.NoError(t, err)
	defer cq.Close()
	o := QPOptions{Port: port, SendCQ: cq, RecvCQ: cq, MaxSendWR: 32, MaxRecvWR: 16, MaxSendSGE: 3, MaxRecvSGE: 2, MaxInline: 64,
		Access: AccessLocalWrite | AccessRemoteWrite}
	qa, err := pd.CreateQP(o)
	require.NoError(t, err)
	defer qa.Close()
	qb, err := pd.CreateQP(o)
	require.NoError(t, err)
	defer qb.Close()
	caps := qa.Caps()
	require.GreaterOrEqual(t, caps.MaxSendWR, 32)
	require.GreaterOrEqual(t, caps.MaxRecvWR, 16)
	require.Equal(t, 3, caps.MaxSendSGE)
	require.GreaterOrEqual(t, caps.MaxInline, 64)

	q, err := qa.Query()
	require.NoError(t, err)
	require.Equal(t, QPInit, q.State)
	require.Equal(t, uint8(port.Num), q.Port)
	require.Equal(t, AccessLocalWrite|AccessRemoteWrite, q.Access)

	ea, eb := qa.Endpoint(), qb.Endpoint()
	require.NotEqual(t, ea.QPN, eb.QPN)
	require.Equal(t, port.GID.GID, ea.GID)
	require.NoError(t, qa.Connect(eb, cfg))
	q, err = qa.Query()
	require.NoError(t, err)
	t.Logf("QP %#x on the device: %v", qa.QPN(), q)
	require.Equal(t, QPRTS, q.State)
	require.Equal(t, eb.QPN, q.DestQPN)
	require.Equal(t, eb.PSN, q.RQPSN)
	require.Equal(t, ea.PSN, q.SQPSN)
	require.Equal(t, port.Attr.ActiveMTU, q.PathMTU)
	require.Equal(t, uint8(17), q.Timeout)
	require.Equal(t, uint8(5), q.RetryCnt)
	require.Equal(t, uint8(7), q.RNRRetry)
	require.Equal(t, uint8(minRNRTimer), q.MinRNRTimer)
	require.Equal(t, uint8(port.Num), q.AH.Port)
	if port.Attr.LinkLayer == LinkEthernet {
		require.True(t, q.AH.IsGlobal)
		require.Equal(t, eb.GID, q.AH.DGID)
		require.Equal(t, uint8(port.GID.Index), q.AH.SGIDIndex)
		require.Equal(t, uint8(32), q.AH.TrafficClass)
	}
	require.Equal(t, QPRTS, qa.State())

	// The state machine refuses what the device would, and the device
	// refuses a peer that cannot be reached.
	require.ErrorContains(t, qa.Connect(eb, cfg), "cannot connect a QP in RTS")
	bad := eb
	bad.GID = GID{}
	require.ErrorContains(t, qb.Connect(bad, cfg), "no GID")
	require.Equal(t, QPInit, qb.State())

	require.NoError(t, qa.Flush())
	q, err = qa.Query()
	require.NoError(t, err)
	require.Equal(t, QPErr, q.State)
}

// WRITE, WRITE with immediate, SEND/RECV and READ between the loop's two
// buffers, each with several SGEs, checked byte for byte, including the
// bytes they must not touch.
func TestTransfers(t *testing.T) {
	l := newLoop(t, QPOptions{MaxSendSGE: 4, MaxRecvSGE: 4})
	fill(l.a, 1)
	want := make([]byte, loopSize) // what b must hold

	// WRITE: three pieces of a, gathered, land contiguously at b[1000:].
	pieces := []SGE{l.ma.SGE(0, 100), l.ma.SGE(5000, 3000), l.ma.SGE(9000, 17)}
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 1, Op: OpWrite, Flags: SendSignaled, SGEs: pieces,
		RemoteAddr: l.mb.Addr() + 1000, RKey: l.mb.RKey()}}))
	copy(want[1000:], l.a[0:100])
	copy(want[1100:], l.a[5000:8000])
	copy(want[4100:], l.a[9000:9017])
	wc := l.wait(t, 1)[0]
	require.Equal(t, WC{WRID: 1, Status: WCSuccess, Opcode: WCWrite, QPNum: l.qa.QPN(), ByteLen: wc.ByteLen}, wc)
	require.True(t, bytes.Equal(want, l.b), "RDMA WRITE")

	// WRITE with immediate: the data, and a receive (without SGEs)
	// consumed at b's QP carrying the immediate and the length.
	require.NoError(t, l.qb.PostRecv([]RecvWR{{ID: 77}}))
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 2, Op: OpWriteWithImm, Flags: SendSignaled, Imm: 0xdeadbeef,
		SGEs: []SGE{l.ma.SGE(20000, 65536), l.ma.SGE(100, 1)}, RemoteAddr: l.mb.Addr() + 200000, RKey: l.mb.RKey()}}))
	copy(want[200000:], l.a[20000:20000+65536])
	want[200000+65536] = l.a[100]
	got := l.wait(t, 2)
	byID := map[uint64]WC{}
	for _, wc := range got {
		byID[wc.WRID] = wc
	}
	require.Equal(t, WCWrite, byID[2].Opcode)
	r := byID[77]
	require.Equal(t, WCRecvRDMAWithImm, r.Opcode)
	require.Equal(t, uint32(0xdeadbeef), r.Imm, "the immediate, in host order")
	require.NotZero(t, r.Flags&WCWithImm)
	require.Equal(t, uint32(65537), r.ByteLen)
	require.Equal(t, l.qb.QPN(), r.QPNum)
	require.True(t, bytes.Equal(want, l.b), "RDMA WRITE with immediate")

	// SEND of two pieces scattered over three receive SGEs.
	require.NoError(t, l.qb.PostRecv([]RecvWR{{ID: 78, SGEs: []SGE{l.mb.SGE(300000, 10), l.mb.SGE(400000, 20), l.mb.SGE(500000, 5000)}}}))
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 3, Op: OpSend, Flags: SendSignaled, SGEs: []SGE{l.ma.SGE(7, 25), l.ma.SGE(70000, 1000)}}}))
	stream := append(append([]byte(nil), l.a[7:32]...), l.a[70000:71000]...)
	copy(want[300000:], stream[:10])
	copy(want[400000:], stream[10:30])
	copy(want[500000:], stream[30:])
	got = l.wait(t, 2)
	for _, wc := range got {
		switch wc.WRID {
		case 3:
			require.Equal(t, WCSend, wc.Opcode)
		case 78:
			require.Equal(t, WCRecv, wc.Opcode)
			require.Equal(t, uint32(1025), wc.ByteLen)
			require.Zero(t, wc.Flags&WCWithImm)
		default:
			t.Fatalf("unexpected completion %+v", wc)
		}
	}
	require.True(t, bytes.Equal(want, l.b), "SEND/RECV")

	// READ: b's QP reads a's bytes into two pieces of b.
	require.NoError(t, l.qb.PostSend([]SendWR{{ID: 4, Op: OpRead, Flags: SendSignaled,
		SGEs: []SGE{l.mb.SGE(600000, 4096), l.mb.SGE(700000, 100)}, RemoteAddr: l.ma.Addr() + 123, RKey: l.ma.RKey()}}))
	copy(want[600000:], l.a[123:123+4096])
	copy(want[700000:], l.a[123+4096:123+4196])
	wc = l.wait(t, 1)[0]
	require.Equal(t, WCRead, wc.Opcode)
	require.Equal(t, l.qb.QPN(), wc.QPNum)
	require.True(t, bytes.Equal(want, l.b), "RDMA READ")

	// Inline SEND: the source may change as soon as the post returns.
	require.NoError(t, l.qb.PostRecv([]RecvWR{{ID: 79, SGEs: []SGE{l.mb.SGE(800000, 64)}}}))
	tmp := []byte("inline bytes, not registered")
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 5, Op: OpSend, Flags: SendSignaled | SendInline,
		SGEs: []SGE{{Addr: uint64(addrOf(tmp)), Length: uint32(len(tmp))}}}}))
	copy(want[800000:], tmp)
	tmp[0] = 'X'
	l.wait(t, 2)
	require.True(t, bytes.Equal(want, l.b), "inline SEND")
}

// A chain of requests in one post (longer than one batch), only the last
// signaled: one completion, every write done, in order.
func TestChainedPost(t *testing.T) {
	l := newLoop(t, QPOptions{MaxSendWR: 256, MaxSendSGE: 2, PostBatch: 16})
	fill(l.a, 2)
	var wrs []SendWR
	for i := range 40 {
		wrs = append(wrs, SendWR{ID: uint64(i), Op: OpWrite, RemoteAddr: l.mb.Addr() + uint64(i)*8192, RKey: l.mb.RKey(),
			SGEs: []SGE{l.ma.SGE(i*8192, 4096), l.ma.SGE(i*8192+4096, 4096)}})
	}
	wrs = append(wrs, SendWR{ID: 1000, Op: OpRead, Flags: SendSignaled, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(),
		SGEs: []SGE{l.ma.SGE(loopSize-8192, 8192)}})
	require.NoError(t, l.qa.PostSend(wrs))
	got := l.wait(t, 1)
	require.Equal(t, uint64(1000), got[0].WRID)
	require.True(t, bytes.Equal(l.a[:40*8192], l.b[:40*8192]), "chained WRITEs")
	// The READ came after the writes on the same QP: it read their data.
	require.True(t, bytes.Equal(l.a[:8192], l.a[loopSize-8192:]), "READ after the chained WRITEs")
	n, err := l.cq.Poll(l.wcs)
	require.NoError(t, err)
	require.Zero(t, n, "unsignaled requests completed visibly")
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// Posting and polling allocate nothing.
func TestHotPathAllocs(t *testing.T) {
	l := newLoop(t, QPOptions{MaxSendSGE: 3})
	wrs := []SendWR{{ID: 9, Op: OpWriteWithImm, Flags: SendSignaled, Imm: 5, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(),
		SGEs: []SGE{l.ma.SGE(0, 64), l.ma.SGE(4096, 64), l.ma.SGE(8192, 64)}},
		{ID: 10, Op: OpRead, Flags: SendSignaled, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(65536, 128)}}}
	recvs := []RecvWR{{ID: 11}}
	wcs := make([]WC, 8)
	round := func() {
		if err := l.qb.PostRecv(recvs); err != nil {
			panic(err)
		}
		if err := l.qa.PostSend(wrs); err != nil {
			panic(err)
		}
		for got := 0; got < 3; {
			n, err := l.cq.Poll(wcs)
			if err != nil {
				panic(err)
			}
			for i := range n {
				if wcs[i].Status != WCSuccess {
					panic(l.cq.Check(&wcs[i]))
				}
			}
			got += n
		}
	}
	round()
	allocs := testing.AllocsPerRun(200, round)
	require.Zero(t, allocs, "PostSend, PostRecv and Poll allocate")
	require.Zero(t, testing.AllocsPerRun(100, func() { l.cq.Poll(wcs) }), "an empty Poll allocates")
}

// Wait sleeps on the completion channel when nothing comes, wakes at the
// next completion, ends at its deadline, and ends when the CQ closes.
func TestWaitOnChannel(t *testing.T) {
	l := newLoop(t, QPOptions{})
	// Nothing pending: the deadline ends the wait, as ErrTimeout.
	start := time.Now()
	n, err := l.cq.Wait(l.wcs, start.Add(200*time.Millisecond))
	require.Zero(t, n)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, errs.ErrTimeout)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.True(t, l.cq.armed, "the CQ was not armed before sleeping")

	// A completion that comes while the waiter sleeps wakes it through
	// the channel.
	events := l.cq.events
	done := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		done <- l.qa.PostSend([]SendWR{{ID: 42, Op: OpWrite, Flags: SendSignaled, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(),
			SGEs: []SGE{l.ma.SGE(0, 8)}}})
	}()
	start = time.Now()
	n, err = l.cq.Wait(l.wcs, time.Now().Add(30*time.Second))
	require.NoError(t, <-done)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, uint64(42), l.wcs[0].WRID)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
	require.Greater(t, l.cq.events, events, "woken without a completion event from the channel")
	t.Logf("woke %v after the wait began, %d channel events so far", time.Since(start), l.cq.events)

	// Closing a CQ ends a wait on it.
	lone, err := l.ctx.CreateCQ(4, true)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := lone.Wait(make([]WC, 1), time.Time{})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, lone.Close())
	wg.Wait()
	require.ErrorIs(t, <-done, ErrClosed)
}

// Arm and WaitEvent: a goroutine sleeps on the channel while another polls.
// No event without Arm; an Arm's event at the next completion, which
// WaitEvent leaves in the CQ for the poller; Close ends a WaitEvent.
func TestArmAndWaitEvent(t *testing.T) {
	l := newLoop(t, QPOptions{})
	write := func(id uint64) {
		require.NoError(t, l.qa.PostSend([]SendWR{{ID: id, Op: OpWrite, Flags: SendSignaled, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(),
			SGEs: []SGE{l.ma.SGE(0, 8)}}}))
	}
	poll := func() []uint64 {
		var ids []uint64
		deadline := time.Now().Add(30 * time.Second)
		for len(ids) == 0 && time.Now().Before(deadline) {
			n, err := l.cq.Poll(l.wcs)
			require.NoError(t, err)
			for _, wc := range l.wcs[:n] {
				require.NoError(t, l.cq.Check(&wc))
				ids = append(ids, wc.WRID)
			}
		}
		return ids
	}

	// Not armed: a completion raises no event.
	write(1)
	require.Equal(t, []uint64{1}, poll())
	require.ErrorIs(t, l.cq.WaitEvent(time.Now().Add(200*time.Millisecond)), ErrTimeout)

	// Armed: the next completion wakes the sleeper and stays in the CQ.
	require.NoError(t, l.cq.Arm())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- l.cq.WaitEvent(time.Now().Add(30 * time.Second)) }()
	time.Sleep(200 * time.Millisecond)
	write(2)
	require.NoError(t, <-done)
	t.Logf("woke %v after the wait began", time.Since(start))
	require.Equal(t, []uint64{2}, poll())

	// One event per Arm.
	write(3)
	require.Equal(t, []uint64{3}, poll())
	require.ErrorIs(t, l.cq.WaitEvent(time.Now().Add(200*time.Millisecond)), ErrTimeout)

	// Close right after an event: ibv_destroy_cq waits until every event
	// taken from the channel is acknowledged, so a WaitEvent that takes
	// one while Close begins must count it (an event nobody took is no
	// matter). Many rounds, the event and Close racing.
	for i := range 30 {
		closeRacingEvent(t, l, i%3 == 0)
	}
	// An event nobody took does not hold Close up.
	pd, err := l.ctx.AllocPD()
	require.NoError(t, err)
	ecq, err := l.ctx.CreateCQ(16, true)
	require.NoError(t, err)
	buf := make([]byte, 64)
	mr, err := pd.Register(buf, AccessAll)
	require.NoError(t, err)
	qa, err := pd.CreateQP(QPOptions{Port: l.port, SendCQ: ecq, RecvCQ: ecq})
	require.NoError(t, err)
	qb, err := pd.CreateQP(QPOptions{Port: l.port, SendCQ: ecq, RecvCQ: ecq})
	require.NoError(t, err)
	require.NoError(t, qa.Connect(qb.Endpoint(), l.cfg))
	require.NoError(t, qb.Connect(qa.Endpoint(), l.cfg))
	require.NoError(t, ecq.Arm())
	require.NoError(t, qa.PostSend([]SendWR{{ID: 9, Op: OpWrite, Flags: SendSignaled, RemoteAddr: mr.Addr(), RKey: mr.RKey(), SGEs: []SGE{mr.SGE(0, 8)}}}))
	for n := 0; n == 0; {
		n, err = ecq.Poll(l.wcs)
		require.NoError(t, err)
	}
	time.Sleep(50 * time.Millisecond) // the event is queued on the channel, unread
	closed := make(chan error, 1)
	go func() {
		closed <- errors.Join(qa.Close(), qb.Close(), mr.Close(), ecq.Close(), pd.Close())
	}()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs on a completion event nobody took")
	}

	// Close ends a WaitEvent.
	lone, err := l.ctx.CreateCQ(4, true)
	require.NoError(t, err)
	require.NoError(t, lone.Arm())
	go func() { done <- lone.WaitEvent(time.Time{}) }()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, lone.Close())
	require.ErrorIs(t, <-done, ErrClosed)
	require.ErrorIs(t, lone.Arm(), ErrClosed)

	// Without a channel there is nothing to sleep on.
	bare, err := l.ctx.CreateCQ(4, false)
	require.NoError(t, err)
	defer bare.Close()
	require.ErrorIs(t, bare.Arm(), ErrInvalidArgument)
	require.ErrorIs(t, bare.WaitEvent(time.Time{}), ErrInvalidArgument)
}

// closeRacingEvent arms a CQ, starts a WaitEvent on it, makes a
// completion and closes everything at about the same moment; Close must
// return.
func closeRacingEvent(t *testing.T, l *loop, early bool) {
	t.Helper()
	pd, err := l.ctx.AllocPD()
	require.NoError(t, err)
	cq, err := l.ctx.CreateCQ(16, true)
	require.NoError(t, err)
	buf := make([]byte, 64)
	mr, err := pd.Register(buf, AccessAll)
	require.NoError(t, err)
	qa, err := pd.CreateQP(QPOptions{Port: l.port, SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	qb, err := pd.CreateQP(QPOptions{Port: l.port, SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	require.NoError(t, qa.Connect(qb.Endpoint(), l.cfg))
	require.NoError(t, qb.Connect(qa.Endpoint(), l.cfg))
	require.NoError(t, cq.Arm())
	woke := make(chan error, 1)
	go func() { woke <- cq.WaitEvent(time.Now().Add(30 * time.Second)) }()
	require.NoError(t, qa.PostSend([]SendWR{{ID: 9, Op: OpWrite, Flags: SendSignaled, RemoteAddr: mr.Addr(), RKey: mr.RKey(), SGEs: []SGE{mr.SGE(0, 8)}}}))
	if !early {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() {
		closed <- errors.Join(qa.Close(), qb.Close(), mr.Close(), cq.Close(), pd.Close())
	}()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs after a completion event")
	}
	if err := <-woke; err != nil {
		require.ErrorIs(t, err, ErrClosed)
	}
}

// A request that fails completes with its status, and the error names the
// device, the QP and the status; the QP is then in ERR and flushes the rest.
func TestErrorCompletion(t *testing.T) {
	l := newLoop(t, QPOptions{})
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 7, Op: OpWrite, Flags: SendSignaled, RemoteAddr: l.mb.Addr(),
		RKey: l.mb.RKey() ^ 0x5a5a, SGEs: []SGE{l.ma.SGE(0, 16)}}}))
	n, err := l.cq.Wait(l.wcs, time.Now().Add(60*time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	wc := l.wcs[0]
	require.Equal(t, WCRemAccessErr, wc.Status)
	require.Equal(t, uint64(7), wc.WRID)
	err = l.cq.Check(&wc)
	var we *WCError
	require.ErrorAs(t, err, &we)
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{l.ctx.Name(), "QP 0x" + strconv.FormatUint(uint64(l.qa.QPN()), 16), "work request 0x7", "remote access error"} {
		require.Contains(t, msg, want)
	}
	require.NotErrorIs(t, err, ErrFlushed)
	q, err := l.qa.Query()
	require.NoError(t, err)
	require.Equal(t, QPErr, q.State)

	// Later requests of the broken QP are flushed.
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 8, Op: OpWrite, Flags: SendSignaled, RemoteAddr: l.mb.Addr(),
		RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(0, 16)}}}))
	n, err = l.cq.Wait(l.wcs, time.Now().Add(30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, WCFlushErr, l.wcs[0].Status)
	require.ErrorIs(t, l.cq.Check(&l.wcs[0]), ErrFlushed)
	require.Contains(t, l.cq.Check(&l.wcs[0]).Error(), "Work Request Flushed Error")
}

// A peer that vanished: the write is retransmitted GCCL_IB_RETRY_CNT times,
// GCCL_IB_TIMEOUT apart, then fails with "transport retry counter
// exceeded". The device acts on timeout and retry_cnt here, so this also
// checks that they reach it in the right fields (ibv_query_qp reads them
// back through the same declarations, so it cannot tell them apart;
// swapped, the timeout would be 0: retransmit never, and this hangs).
func TestRetryExceeded(t *testing.T) {
	ctx, port, _ := device(t)
	cfg := DefaultConfig()
	cfg.Timeout, cfg.RetryCnt = 12, 0 // 16.8 ms, no retry
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	cq, err := ctx.CreateCQ(16, true)
	require.NoError(t, err)
	defer cq.Close()
	buf := make([]byte, 4096)
	mr, err := pd.Register(buf, AccessAll)
	require.NoError(t, err)
	defer mr.Close()
	o := QPOptions{Port: port, SendCQ: cq, RecvCQ: cq}
	qa, err := pd.CreateQP(o)
	require.NoError(t, err)
	defer qa.Close()
	gone, err := pd.CreateQP(o)
	require.NoError(t, err)
	peer := gone.Endpoint()
	require.NoError(t, gone.Close()) // packets to its number are dropped
	require.NoError(t, qa.Connect(peer, cfg))
	start := time.Now()
	require.NoError(t, qa.PostSend([]SendWR{{ID: 1, Op: OpWrite, Flags: SendSignaled, RemoteAddr: 0x1000, RKey: 1,
		SGEs: []SGE{mr.SGE(0, 64)}}}))
	wcs := make([]WC, 1)
	n, err := cq.Wait(wcs, time.Now().Add(20*time.Second))
	require.NoError(t, err, "no completion: the QP never gave up (its timeout is not %d?)", cfg.Timeout)
	require.Equal(t, 1, n)
	require.Equal(t, WCRetryExcErr, wcs[0].Status)
	require.ErrorContains(t, cq.Check(&wcs[0]), "transport retry counter exceeded")
	t.Logf("gave up after %v: %v", time.Since(start), cq.Check(&wcs[0]))
}

// Flush (to ERR) completes every outstanding receive with a flush error:
// how a transport cancels.
func TestFlushCancels(t *testing.T) {
	l := newLoop(t, QPOptions{})
	require.NoError(t, l.qb.PostRecv([]RecvWR{{ID: 1, SGEs: []SGE{l.mb.SGE(0, 64)}}, {ID: 2}, {ID: 3}}))
	n, err := l.cq.Poll(l.wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, l.qb.Flush())
	require.Equal(t, QPErr, l.qb.State())
	var ids []uint64
	deadline := time.Now().Add(30 * time.Second)
	for len(ids) < 3 {
		n, err := l.cq.Wait(l.wcs, deadline)
		require.NoError(t, err)
		for _, wc := range l.wcs[:n] {
			require.ErrorIs(t, l.cq.Check(&wc), ErrFlushed)
			require.Equal(t, l.qb.QPN(), wc.QPNum)
			ids = append(ids, wc.WRID)
		}
	}
	require.Equal(t, []uint64{1, 2, 3}, ids)
	require.ErrorContains(t, l.qb.Connect(l.qa.Endpoint(), l.cfg), "cannot connect a QP in ERR")
}

func TestPostChecks(t *testing.T) {
	ctx, port, _ := device(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	cq, err := ctx.CreateCQ(8, false)
	require.NoError(t, err)
	defer cq.Close()
	q, err := pd.CreateQP(QPOptions{Port: port, SendCQ: cq, RecvCQ: cq, MaxSendSGE: 2, MaxRecvSGE: 1, PostBatch: 2})
	require.NoError(t, err)
	defer q.Close()
	buf := make([]byte, 4096)
	mr, err := pd.Register(buf, AccessLocalWrite)
	require.NoError(t, err)
	defer mr.Close()

	// Not connected.
	err = q.PostSend([]SendWR{{Op: OpSend, SGEs: []SGE{mr.SGE(0, 8)}}})
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "the QP is in INIT (Connect it first)")
	// Receives may be posted in INIT; too many SGEs are refused with the
	// index of the request.
	// Posts go in batches of 2 here: the first batch is posted, the
	// refused request's is not.
	one := []SGE{mr.SGE(0, 8)}
	err = q.PostRecv([]RecvWR{{ID: 1, SGEs: one}, {ID: 2, SGEs: one}, {ID: 3, SGEs: one}, {ID: 4, SGEs: []SGE{mr.SGE(0, 8), mr.SGE(8, 8)}}})
	var pe *PostError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 2, pe.Posted)
	require.ErrorContains(t, err, "work request 3: 2 SGEs (the QP takes 1)")
	require.ErrorContains(t, err, "QP 0x"+strconv.FormatUint(uint64(q.QPN()), 16))
	require.Panics(t, func() { mr.SGE(4000, 100) })

	_, err = pd.RegisterAddr(0, 10, AccessAll)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = pd.Register(nil, AccessAll)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = ctx.CreateCQ(0, false)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = pd.CreateQP(QPOptions{Port: port, SendCQ: cq, RecvCQ: cq, MaxSendSGE: ctx.Attr().MaxSGE + 1})
	require.ErrorIs(t, err, ErrInvalidArgument)
	// Registering memory that is not mapped fails with what to check.
	_, err = pd.RegisterAddr(1<<46, 1<<20, AccessLocalWrite)
	require.Error(t, err)
	require.ErrorContains(t, err, "ibv_reg_mr of 1048576 bytes")
	t.Log(err)
}

// Live counts every object until it is closed, and a parent with live
// children refuses to close, saying which.
func TestLiveAndCloseOrder(t *testing.T) {
	before := Live()
	ctx, port, _ := device(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cq, err := ctx.CreateCQ(8, true)
	require.NoError(t, err)
	mr, err := pd.Register(make([]byte, 8192), AccessAll)
	require.NoError(t, err)
	q, err := pd.CreateQP(QPOptions{Port: port, SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	now := Live()
	require.Equal(t, LiveCounts{Contexts: 1, PDs: 1, MRs: 1, CQs: 1, QPs: 1}, LiveCounts{
		now.Contexts - before.Contexts, now.PDs - before.PDs, now.MRs - before.MRs, now.CQs - before.CQs, now.QPs - before.QPs})

	require.ErrorContains(t, pd.Close(), "close the PD's 2 MRs and QPs before it")
	require.ErrorContains(t, cq.Close(), "close the 2 QPs using the CQ before it") // as send and as receive CQ
	require.ErrorContains(t, ctx.Close(), "close its 2 PDs and CQs before the device")
	require.NoError(t, q.Close())
	require.NoError(t, q.Close(), "a second Close is a no-op")
	require.ErrorIs(t, q.PostRecv([]RecvWR{{}}), ErrClosed)
	require.NoError(t, mr.Close())
	require.NoError(t, cq.Close())
	_, err = cq.Poll(make([]WC, 1))
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, pd.Close())
	_, err = pd.Register(make([]byte, 10), AccessAll)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, ctx.Close())
	_, err = ctx.AllocPD()
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, before, Live())
	require.True(t, strings.HasPrefix(Live().String(), "0 contexts") || before.Total() > 0)
}
