package p2p

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"strings"
	"testing"
	"time"
)

// allocatedPerCall is the average number of bytes f allocates.
func allocatedPerCall(f func()) uint64 {
	const runs = 20
	f() // warm up (sync.Once, pools)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / runs
}

// resealed recomputes a blob's checksum after a test edited it, so that
// the decoder gets past the CRC to the field under test.
func resealed(blob []byte) []byte {
	body := blob[:len(blob)-4]
	return binary.LittleEndian.AppendUint32(body[:len(body):len(body)], crc32.Checksum(body, castagnoli))
}

// Headers announcing more than a peer may send are refused before a byte
// of payload is read or allocated; the error names the op and both sizes.
func TestWireRefusesOverLimitPayloads(t *testing.T) {
	for _, h := range []header{
		{op: opNotif, length: maxNotifLen + 1},
		{op: opHello, length: maxCtrlPayload + 1},
		{op: opCommit, flags: flagNotify | flagAck, length: maxNotifLen + 1},
		{op: opAbort, length: maxCtrlPayload + 1},
		{op: opAck, flags: flagError, length: maxCtrlPayload + 1},
		{op: opReadResp, flags: flagError, length: maxCtrlPayload + 1},
		{op: opRDMAConnect, length: maxRDMAConnectLen + 1},
		{op: opRDMAAccept, length: maxRDMAAcceptLen + 1},
		{op: opRDMAAccept, flags: flagError, length: maxCtrlPayload + 1},
	} {
		var b [wireHeaderLen]byte
		putHeader(b[:], h)
		_, err := parseHeader(b[:])
		if err == nil {
			t.Errorf("%v of %d bytes (flags %#x) accepted", h.op, h.length, h.flags)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprint(h.length)) {
			t.Errorf("%v: error %q does not give the size %d", h.op, err, h.length)
		}
	}
	// At the limit, each is accepted.
	for _, h := range []header{
		{op: opNotif, length: maxNotifLen},
		{op: opRDMAConnect, length: maxRDMAConnectLen},
		{op: opRDMAAccept, length: maxRDMAAcceptLen},
	} {
		var b [wireHeaderLen]byte
		putHeader(b[:], h)
		if _, err := parseHeader(b[:]); err != nil {
			t.Errorf("%v of %d bytes refused: %v", h.op, h.length, err)
		}
	}
}

// A connected peer announcing an over-limit notification is dropped, with
// an error that names it, and the agent allocates nothing for the payload.
func TestPeerOverLimitNotificationDropsIt(t *testing.T) {
	a := newAgent(t, "target", Config{ListenAddr: "-"})
	p, c := fakePeer(t, a)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	c.Write(frame(header{op: opNotif, length: 1 << 40}, nil))
	waitFor(t, func() bool { return p.err() != nil })
	runtime.ReadMemStats(&after)
	err := p.err()
	if !errors.Is(err, ErrRemoteDisconnect) || !strings.Contains(err.Error(), "fake") || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("peer error %v: want ErrRemoteDisconnect naming peer fake and the limit", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("refusing a 1 TiB notification allocated %d bytes", n)
	}
}

// A metadata blob is bounded as a whole (it must fit a hello, whether it
// came in one or from the KV store) and in regions; what a blob makes the
// agent allocate stays a small multiple of its size.
func TestMetadataLimits(t *testing.T) {
	// Over the size limit: refused before any field is read.
	big := make([]byte, maxMetadataLen+1)
	copy(big, metadataMagic)
	_, err := decodeMetadata(big)
	if !errors.Is(err, ErrBadMetadata) || !strings.Contains(err.Error(), fmt.Sprint(maxMetadataLen)) {
		t.Fatalf("blob of %d bytes: %v", len(big), err)
	}
	if n := allocatedPerCall(func() { decodeMetadata(big) }); n > 1<<10 {
		t.Errorf("refusing a %d-byte blob allocated %d bytes", len(big), n)
	}

	// A region count the bytes cannot hold: refused, naming the agent,
	// with nothing allocated for the regions.
	m := sampleInfo()
	m.Regions = nil
	blob := encodeMetadata(m)
	binary.LittleEndian.PutUint32(blob[len(blob)-8:], 1<<20) // the count, just before the CRC
	blob = resealed(blob)
	_, err = decodeMetadata(blob)
	if err == nil || !strings.Contains(err.Error(), `agent "prefill-0"`) || !strings.Contains(err.Error(), "1048576 regions") {
		t.Fatalf("blob claiming 2^20 regions: %v", err)
	}
	if n := allocatedPerCall(func() { decodeMetadata(blob) }); n > 4<<10 {
		t.Errorf("refusing a blob claiming 2^20 regions allocated %d bytes", n)
	}

	// As many regions as the size limit admits: decoded, at a small
	// multiple of the blob's size.
	m = sampleInfo()
	m.Regions = nil
	const fileRecord = regionRecordMin // a FILE region with no segment name has no tail
	for i := range (maxMetadataLen - len(encodeMetadata(m))) / fileRecord {
		m.Regions = append(m.Regions, regionInfo{ID: uint32(i + 1), Type: FILE, Len: 1})
	}
	blob = encodeMetadata(m)
	if len(blob) > maxMetadataLen || len(blob)+fileRecord <= maxMetadataLen {
		t.Fatalf("%d regions make a %d-byte blob: not the most that fit in %d", len(m.Regions), len(blob), maxMetadataLen)
	}
	got, err := decodeMetadata(blob)
	if err != nil {
		t.Fatalf("blob of %d regions, %d bytes: %v", len(m.Regions), len(blob), err)
	}
	if len(got.Regions) != len(m.Regions) {
		t.Fatalf("decoded %d regions of %d", len(got.Regions), len(m.Regions))
	}
	n := allocatedPerCall(func() { decodeMetadata(blob) })
	t.Logf("a %d-byte blob of %d regions (the most that fit) decodes with %d bytes allocated", len(blob), len(m.Regions), n)
	if n > 16*uint64(len(blob)) {
		t.Errorf("decoding a %d-byte blob allocated %d bytes, more than 16x its size", len(blob), n)
	}
	// One more region does not fit.
	m.Regions = append(m.Regions, regionInfo{ID: uint32(len(m.Regions) + 1), Type: FILE, Len: 1})
	if _, err := decodeMetadata(encodeMetadata(m)); !errors.Is(err, ErrBadMetadata) {
		t.Errorf("blob over the size limit: %v", err)
	}

	// Too many RDMA keys for one region: refused, naming region and agent.
	m = sampleInfo()
	keys := make([]rkeyRange, maxRegionKeys+1)
	for i := range keys {
		keys[i] = rkeyRange{Off: uint64(i), Len: 1, RKey: 1}
	}
	m.Regions[0].Len = uint64(len(keys))
	m.Keys = map[uint32][]rkeyRange{m.Regions[0].ID: keys}
	_, err = decodeMetadata(encodeMetadata(m))
	if err == nil || !strings.Contains(err.Error(), "region 1") || !strings.Contains(err.Error(), `agent "prefill-0"`) {
		t.Errorf("region with %d keys: %v", len(keys), err)
	}
}

// A peer whose notifications pile up unread past Config.NotifQueue is
// dropped with an error that names it and the limit; what was queued before
// stays readable, and GetNotifs frees the room again.
func TestNotificationQueueIsBounded(t *testing.T) {
	const limit = 4 << 10
	a := newAgent(t, "target", Config{ListenAddr: "-", NotifQueue: limit})
	p, c := fakePeer(t, a)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	msg := make([]byte, 1000)
	fits := limit / (len(msg) + notifOverhead) // 3
	for i := range fits {
		msg[0] = byte(i)
		if _, err := c.Write(frame(header{op: opNotif, length: uint64(len(msg))}, msg)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { a.notifMu.Lock(); defer a.notifMu.Unlock(); return len(a.notifs["fake"]) == fits })
	if p.err() != nil {
		t.Fatalf("dropped at %d notifications within the limit: %v", fits, p.err())
	}
	c.Write(frame(header{op: opNotif, length: uint64(len(msg))}, msg))
	waitFor(t, func() bool { return p.err() != nil })
	err := p.err()
	if !errors.Is(err, ErrRemoteDisconnect) || !strings.Contains(err.Error(), "fake") || !strings.Contains(err.Error(), "NotifQueue") {
		t.Fatalf("peer error %v: want ErrRemoteDisconnect naming peer fake and NotifQueue", err)
	}
	got := a.GetNotifs()["fake"]
	if len(got) != fits {
		t.Fatalf("%d notifications kept, want the %d queued before the limit", len(got), fits)
	}
	for i, m := range got {
		if len(m) != len(msg) || m[0] != byte(i) {
			t.Fatalf("notification %d: %d bytes, first %d", i, len(m), m[0])
		}
	}
	// Room again after GetNotifs: the agent's own count starts over.
	if err := a.deliverNotif("fake", msg); err != nil {
		t.Fatalf("after GetNotifs: %v", err)
	}
}

func TestNotifQueueConfig(t *testing.T) {
	if a, err := New("neg", Config{ListenAddr: "-", NotifQueue: -1}); err == nil {
		a.Close()
		t.Fatal("a negative NotifQueue was accepted")
	}
}

// A peer that sends pings and never reads the answers is dropped once
// maxQueuedReplies answers wait, with an error that names it, rather than
// making the target hold ever more replies.
func TestUnreadRepliesAreBounded(t *testing.T) {
	old := maxQueuedReplies
	maxQueuedReplies = 16
	t.Cleanup(func() { maxQueuedReplies = old })
	a := newAgent(t, "target", Config{ListenAddr: "-"})
	p, ours := fakePeerNotReading(t, a)
	ours.SetWriteDeadline(time.Now().Add(10 * time.Second))
	for i := 0; i < 4*maxQueuedReplies && p.err() == nil; i++ {
		if _, err := ours.Write(frame(header{op: opPing, aux: uint64(i + 1)}, nil)); err != nil {
			break // the target dropped the connection
		}
	}
	waitFor(t, func() bool { return p.err() != nil })
	err := p.err()
	if !errors.Is(err, ErrRemoteDisconnect) || !strings.Contains(err.Error(), "fake") || !strings.Contains(err.Error(), "does not read") {
		t.Fatalf("peer error %v: want ErrRemoteDisconnect naming fake and the unread replies", err)
	}
}
