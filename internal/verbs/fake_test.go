//go:build linux && cgo

package verbs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/verbs/verbstest"
)

// TestFakeLibrary runs the TestOnFake tests in a child process that loads
// the fake libibverbs (testdata/fakeibv.c), which the p2p tests use on
// machines without an RDMA device: the binding's plumbing works against
// it, and it behaves as the binding expects of a device.
func TestFakeLibrary(t *testing.T) {
	if verbstest.InChild() {
		t.Skip("this is the child")
	}
	verbstest.RunChild(t, "^TestOnFake")
}

// fakeLoop is newLoop on the fake device (which sysfs does not list).
func fakeLoop(t *testing.T) *loop {
	t.Helper()
	if !verbstest.InChild() {
		t.Skip("runs in TestFakeLibrary's child process")
	}
	names, err := DeviceNames()
	require.NoError(t, err)
	require.Equal(t, []string{"fakeibv0"}, names)
	ctx, err := Open(names[0])
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctx.Close()) })
	port, err := ctx.Port(1, DefaultConfig())
	require.NoError(t, err)
	require.Equal(t, LinkInfiniBand, port.Attr.LinkLayer)
	l := &loop{ctx: ctx, port: port, cfg: DefaultConfig(), wcs: make([]WC, 16)}
	l.pd, err = ctx.AllocPD()
	require.NoError(t, err)
	l.cq, err = ctx.CreateCQ(512, true)
	require.NoError(t, err)
	l.a, l.b = make([]byte, loopSize), make([]byte, loopSize)
	l.ma, err = l.pd.Register(l.a, AccessAll)
	require.NoError(t, err)
	l.mb, err = l.pd.Register(l.b, AccessAll)
	require.NoError(t, err)
	o := QPOptions{Port: port, SendCQ: l.cq, RecvCQ: l.cq}
	l.qa, err = l.pd.CreateQP(o)
	require.NoError(t, err)
	l.qb, err = l.pd.CreateQP(o)
	require.NoError(t, err)
	require.NoError(t, l.qa.Connect(l.qb.Endpoint(), l.cfg))
	require.NoError(t, l.qb.Connect(l.qa.Endpoint(), l.cfg))
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{l.qa, l.qb, l.ma, l.mb, l.cq, l.pd} {
			require.NoError(t, c.Close())
		}
	})
	return l
}

// WRITE, READ, SEND and WRITE with immediate, chained, with several SGEs,
// through the fake NIC; a bad remote key fails the QP and flushes its
// later work; Flush flushes receives.
func TestOnFakeTransfers(t *testing.T) {
	l := fakeLoop(t)
	fill(l.a, 1)
	clear(l.b)
	// Receives for the WRITE with immediate, then the SEND (in that order).
	require.NoError(t, l.qb.PostRecv([]RecvWR{{ID: 101}, {ID: 100, SGEs: []SGE{l.mb.SGE(900000, 4096)}}}))
	wrs := []SendWR{
		{ID: 1, Op: OpWrite, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(0, 1000), l.ma.SGE(5000, 3000)}},
		{ID: 2, Op: OpWriteWithImm, Imm: 0xdeadbeef, RemoteAddr: l.mb.Addr() + 4000, RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(4000, 200000)}, Flags: SendSignaled},
		{ID: 3, Op: OpSend, SGEs: []SGE{l.ma.SGE(700000, 100)}, Flags: SendSignaled},
		{ID: 4, Op: OpRead, RemoteAddr: l.mb.Addr() + 600000, RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(300000, 5000)}, Flags: SendSignaled},
	}
	copy(l.b[600000:605000], l.a[0:5000]) // what the READ fetches
	require.NoError(t, l.qa.PostSend(wrs))
	got := l.wait(t, 5)
	byID := map[uint64]WC{}
	for _, wc := range got {
		byID[wc.WRID] = wc
	}
	require.Len(t, byID, 5, "%+v", got)
	require.Equal(t, WCRecvRDMAWithImm, byID[101].Opcode)
	require.Equal(t, uint32(0xdeadbeef), byID[101].Imm)
	require.Equal(t, WCRecv, byID[100].Opcode)
	require.Equal(t, uint32(100), byID[100].ByteLen)
	require.Equal(t, l.a[:1000], l.b[:1000])
	require.Equal(t, l.a[5000:8000], l.b[1000:4000])
	require.Equal(t, l.a[4000:204000], l.b[4000:204000])
	require.Equal(t, l.a[700000:700100], l.b[900000:900100])
	require.Equal(t, l.a[0:5000], l.a[300000:305000])

	// A wrong remote key: REM_ACCESS_ERR, then the QP's later work flushes.
	require.NoError(t, l.qa.PostSend([]SendWR{
		{ID: 7, Op: OpWrite, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey() ^ 0x55, SGEs: []SGE{l.ma.SGE(0, 8)}},
		{ID: 8, Op: OpWrite, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(0, 8)}},
	}))
	var wcs [4]WC
	var errs []error
	deadline := time.Now().Add(10 * time.Second)
	for len(errs) < 2 {
		n, err := l.cq.Wait(wcs[:], deadline)
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			errs = append(errs, l.cq.Check(&wc))
		}
	}
	var we *WCError
	require.ErrorAs(t, errs[0], &we)
	require.Equal(t, WCRemAccessErr, we.WC.Status)
	require.ErrorIs(t, errs[1], ErrFlushed)
	// Receives of a QP in ERR flush.
	require.NoError(t, l.qb.PostRecv([]RecvWR{{ID: 200}}))
	require.NoError(t, l.qb.Flush())
	n, err := l.cq.Wait(wcs[:], time.Now().Add(10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, l.cq.Check(&wcs[0]), ErrFlushed)
}

// Send-queue slots come back only with a polled signaled completion, as on
// hardware: posting more unsignaled work than MaxSendWR is ENOMEM.
func TestOnFakeSendQueueFull(t *testing.T) {
	if !verbstest.InChild() {
		t.Skip("runs in TestFakeLibrary's child process")
	}
	l := fakeLoop(t)
	wrs := make([]SendWR, l.qa.Caps().MaxSendWR+1)
	for i := range wrs {
		wrs[i] = SendWR{ID: uint64(i), Op: OpWrite, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(0, 8)}}
	}
	err := l.qa.PostSend(wrs)
	var pe *PostError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, len(wrs)-1, pe.Posted)
	require.ErrorIs(t, err, syscall.ENOMEM)
}

// RegisterDmabuf maps the descriptor at the offset given; addresses start
// at iova. GCCL_FAKE_IBV_NO_DMABUF makes the fake refuse, as a kernel
// without dma-buf support does.
func TestOnFakeDmabuf(t *testing.T) {
	l := fakeLoop(t)
	fd, err := unix.MemfdCreate("dmabuf", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer syscall.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 1<<20))
	m, err := unix.Mmap(fd, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(m)
	const iova = 0x7f0000000000
	mr, err := l.pd.RegisterDmabuf(8192, 65536, iova, fd, AccessAll)
	require.NoError(t, err)
	require.Equal(t, uint64(iova), mr.Addr())
	fill(l.a[:4096], 9)
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 1, Op: OpWrite, Flags: SendSignaled, RemoteAddr: iova + 100, RKey: mr.RKey(), SGEs: []SGE{l.ma.SGE(0, 4096)}}}))
	l.wait(t, 1)
	require.Equal(t, l.a[:4096], m[8192+100:8192+100+4096])
	require.NoError(t, mr.Close())

	t.Setenv("GCCL_FAKE_IBV_NO_DMABUF", "1")
	_, err = l.pd.RegisterDmabuf(0, 4096, iova, fd, AccessAll)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.ErrorIs(t, err, syscall.EOPNOTSUPP)
	require.Contains(t, err.Error(), "ibv_reg_dmabuf_mr")
	require.Contains(t, err.Error(), "does not register dma-buf memory")
	_, err = l.pd.RegisterDmabuf(0, 0, iova, fd, AccessAll)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// The NIC stops while GCCL_FAKE_IBV_STALL_FILE exists; a QP moved to ERR
// meanwhile has its queued work flushed, none of it applied.
func TestOnFakeStallAndFlush(t *testing.T) {
	l := fakeLoop(t)
	stall := filepath.Join(t.TempDir(), "stall")
	t.Setenv("GCCL_FAKE_IBV_STALL_FILE", stall)
	require.NoError(t, os.WriteFile(stall, nil, 0o600))
	fill(l.a, 3)
	clear(l.b)
	require.NoError(t, l.qa.PostSend([]SendWR{{ID: 1, Op: OpWrite, Flags: SendSignaled, RemoteAddr: l.mb.Addr(), RKey: l.mb.RKey(), SGEs: []SGE{l.ma.SGE(0, loopSize)}}}))
	var wcs [2]WC
	n, err := l.cq.Wait(wcs[:], time.Now().Add(200*time.Millisecond))
	require.True(t, errors.Is(err, ErrTimeout), "stalled NIC: %d completions, %v", n, err)
	require.NoError(t, l.qa.Flush())
	require.NoError(t, os.Remove(stall))
	n, err = l.cq.Wait(wcs[:], time.Now().Add(10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, l.cq.Check(&wcs[0]), ErrFlushed)
	require.Equal(t, make([]byte, loopSize), l.b, "flushed work landed")
}
