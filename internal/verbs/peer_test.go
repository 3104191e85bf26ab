//go:build linux && cgo

package verbs

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// peerRun is one rank of a two-rank exchange, the same steps on both
// sides: each registers a buffer (a source half and a destination half),
// sends its QP's Endpoint and its buffer's address and key over conn,
// connects, then WRITEs with immediate and SENDs into the peer and READs
// from it, checking every byte. This is what a transport does over its
// bootstrap.
func peerRun(t *testing.T, rank int, conn net.Conn) {
	const half = 128 << 10
	start := time.Now()
	ctx, port, cfg := device(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	cq, err := ctx.CreateCQ(64, true)
	require.NoError(t, err)
	defer cq.Close()
	buf := make([]byte, 2*half)
	fill(buf[:half], uint64(100+rank))
	mr, err := pd.Register(buf, AccessAll)
	require.NoError(t, err)
	defer mr.Close()
	qp, err := pd.CreateQP(QPOptions{Port: port, SendCQ: cq, RecvCQ: cq})
	require.NoError(t, err)
	defer qp.Close()
	// Receives before the peer can send: one for the WRITE with
	// immediate, one for the SEND.
	require.NoError(t, qp.PostRecv([]RecvWR{{ID: 1}, {ID: 2, SGEs: []SGE{mr.SGE(half+64<<10, 4096)}}}))

	// Exchange endpoints and buffers.
	me, err := qp.Endpoint().MarshalBinary()
	require.NoError(t, err)
	me = binary.BigEndian.AppendUint64(me, mr.Addr())
	me = binary.BigEndian.AppendUint32(me, mr.RKey())
	_, err = conn.Write(me)
	require.NoError(t, err)
	msg := make([]byte, EndpointSize+12)
	_, err = io.ReadFull(conn, msg)
	require.NoError(t, err)
	var peer Endpoint
	require.NoError(t, peer.UnmarshalBinary(msg[:EndpointSize]))
	peerAddr, peerKey := binary.BigEndian.Uint64(msg[EndpointSize:]), binary.BigEndian.Uint32(msg[EndpointSize+8:])
	t.Logf("rank %d: %v; peer %v", rank, qp.Endpoint(), peer)
	require.NoError(t, qp.Connect(peer, cfg))
	barrier := func(b byte) {
		_, err := conn.Write([]byte{b})
		require.NoError(t, err)
		var got [1]byte
		_, err = io.ReadFull(conn, got[:])
		require.NoError(t, err)
		require.Equal(t, b, got[0])
	}
	barrier('R') // both QPs are in RTS

	// WRITE 64 KiB (two pieces) with an immediate into the peer's
	// destination half, and SEND 1000 bytes.
	require.NoError(t, qp.PostSend([]SendWR{
		{ID: 10, Op: OpWriteWithImm, Flags: SendSignaled, Imm: 0xa0 + uint32(rank), RemoteAddr: peerAddr + half, RKey: peerKey,
			SGEs: []SGE{mr.SGE(0, 40<<10), mr.SGE(40<<10, 24<<10)}},
		{ID: 11, Op: OpSend, Flags: SendSignaled, SGEs: []SGE{mr.SGE(64<<10, 1000)}},
	}))
	wcs := make([]WC, 8)
	seen := map[uint64]WC{}
	deadline := time.Now().Add(60 * time.Second)
	for len(seen) < 4 {
		n, err := cq.Wait(wcs, deadline)
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			require.NoError(t, cq.Check(&wc))
			seen[wc.WRID] = wc
		}
	}
	require.Equal(t, WCRecvRDMAWithImm, seen[1].Opcode)
	require.Equal(t, uint32(0xa0+1-rank), seen[1].Imm)
	require.Equal(t, uint32(64<<10), seen[1].ByteLen)
	require.Equal(t, WCRecv, seen[2].Opcode)
	require.Equal(t, uint32(1000), seen[2].ByteLen)
	want := make([]byte, half)
	fill(want, uint64(100+1-rank))
	require.True(t, bytes.Equal(want[:64<<10], buf[half:half+64<<10]), "rank %d: the peer's WRITE", rank)
	require.True(t, bytes.Equal(want[64<<10:64<<10+1000], buf[half+64<<10:half+64<<10+1000]), "rank %d: the peer's SEND", rank)

	// READ 32 KiB of the peer's source into the end of the destination.
	require.NoError(t, qp.PostSend([]SendWR{{ID: 12, Op: OpRead, Flags: SendSignaled, RemoteAddr: peerAddr + 100, RKey: peerKey,
		SGEs: []SGE{mr.SGE(2*half-32<<10, 32<<10)}}}))
	n, err := cq.Wait(wcs[:1], deadline)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, cq.Check(&wcs[0]))
	require.Equal(t, WCRead, wcs[0].Opcode)
	require.True(t, bytes.Equal(want[100:100+32<<10], buf[2*half-32<<10:]), "rank %d: READ from the peer", rank)
	barrier('D') // the peer is done reading this side's memory
	t.Logf("rank %d: exchange done in %v", rank, time.Since(start))
}

// Two processes on one device, as two ranks of a host: the second is this
// test binary again, running TestPeerHelper.
func TestTwoProcesses(t *testing.T) {
	device(t) // skips without one
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerHelper$", "-test.v")
	cmd.Env = append(os.Environ(), "GCCL_VERBS_PEER="+ln.Addr().String())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	conn, err := ln.Accept()
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the peer process did not connect: %v\n%s", err, out.String())
	}
	defer conn.Close()
	peerRun(t, 0, conn)
	err = cmd.Wait()
	t.Logf("peer process:\n%s", out.String())
	require.NoError(t, err)
	require.Contains(t, out.String(), "--- PASS: TestPeerHelper")
}

// TestPeerHelper is TestTwoProcesses' second rank; it runs only there.
func TestPeerHelper(t *testing.T) {
	addr := os.Getenv("GCCL_VERBS_PEER")
	if addr == "" {
		t.Skip("the second process of TestTwoProcesses")
	}
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	peerRun(t, 1, conn)
}

// Two hosts: run by tests/rxe/run.sh in two VMs joined by a virtual wire,
// each with its own rxe device; RXEVM_RANK and RXEVM_PEER_ADDR say which
// side this is and where the other is.
func TestTwoHosts(t *testing.T) {
	rank, peer := os.Getenv("RXEVM_RANK"), os.Getenv("RXEVM_PEER_ADDR")
	if rank == "" || peer == "" {
		t.Skip("needs two hosts: tests/rxe/run.sh runs it in two VMs")
	}
	const port = "18515"
	var conn net.Conn
	if rank == "0" {
		ln, err := net.Listen("tcp", ":"+port)
		require.NoError(t, err)
		defer ln.Close()
		require.NoError(t, ln.(*net.TCPListener).SetDeadline(time.Now().Add(120*time.Second)))
		conn, err = ln.Accept()
		require.NoError(t, err)
	} else {
		var err error
		for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if conn, err = net.Dial("tcp", net.JoinHostPort(peer, port)); err == nil || time.Now().After(deadline) {
				break
			}
		}
		require.NoError(t, err)
	}
	defer conn.Close()
	r := 0
	if rank != "0" {
		r = 1
	}
	peerRun(t, r, conn)
}
