package p2p

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
	"time"
)

func TestRegionTableFind(t *testing.T) {
	var tb regionTable
	tb.add(regionInfo{ID: 1, Type: DRAM, Base: 1000, Len: 100})
	tb.add(regionInfo{ID: 2, Type: DRAM, Base: 1050, Len: 200}) // overlaps 1
	tb.add(regionInfo{ID: 3, Type: DRAM, Base: 5000, Len: 10})
	tb.add(regionInfo{ID: 4, Type: FILE, Base: 4096, Len: 8192})
	tb.add(regionInfo{ID: 5, Type: VRAM, Base: 1000, Len: 100, Dev: 1}) // same addresses as DRAM region 1
	tb.add(regionInfo{ID: 6, Type: VRAM, Base: 2000, Len: 100, Dev: 0})
	cases := []struct {
		typ       MemType
		addr, n   uint64
		dev       uint32
		want      uint32
		wantError bool
	}{
		{DRAM, 1000, 100, 0, 1, false},
		{DRAM, 1000, 101, 0, 0, true}, // crosses out of region 1 and starts before 2
		{DRAM, 1060, 150, 0, 2, false},
		{DRAM, 1060, 10, 0, 2, false}, // both hold it: the nearest start wins
		{DRAM, 1010, 10, 0, 1, false},
		{DRAM, 999, 1, 0, 0, true},
		{DRAM, 1249, 1, 0, 2, false},
		{DRAM, 1250, 1, 0, 0, true},
		{DRAM, 5000, 10, 0, 3, false},
		{DRAM, 5005, 10, 0, 0, true},
		{DRAM, ^uint64(0) - 1, 4, 0, 0, true}, // wraps
		{FILE, 4096, 8192, 4, 4, false},
		{FILE, 4095, 10, 4, 0, true},
		{FILE, 4096, 10, 5, 0, true}, // no such file region
		{VRAM, 0, 1, 0, 0, true},
		{VRAM, 1000, 100, 1, 5, false},
		{VRAM, 1000, 100, 0, 0, true}, // another device
		{VRAM, 1050, 51, 1, 0, true},
		{VRAM, 2000, 10, 0, 6, false},
		{VRAM, 2000, 10, 1, 0, true},
	}
	for _, c := range cases {
		r, err := tb.find(c.typ, c.addr, c.n, c.dev)
		if c.wantError != (err != nil) || err == nil && r.ID != c.want {
			t.Errorf("find(%v, %d, %d, dev %d) = region %d, %v; want %d (error %v)", c.typ, c.addr, c.n, c.dev, r.ID, err, c.want, c.wantError)
		}
	}
	tb.remove(2)
	if _, err := tb.find(DRAM, 1060, 150, 0); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("after removal: %v", err)
	}
	if got := len(tb.all()); got != 5 {
		t.Errorf("%d regions left, want 5", got)
	}
	tb.remove(5)
	if _, err := tb.find(VRAM, 1000, 100, 1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("after removal of VRAM: %v", err)
	}
	if r, ok := tb.byID(6); !ok || r.Dev != 0 {
		t.Errorf("byID(6) = %+v, %v", r, ok)
	}
}

func sampleInfo() *agentInfo {
	m := &agentInfo{Gen: 7, Name: "prefill-0", Host: "h/boot", Addr: "10.0.0.1:4242", Pid: 1234, Probe: 0xdeadbeef,
		Regions: []regionInfo{
			{ID: 1, Type: DRAM, Base: 0x7f0000000000, Len: 1 << 30},
			{ID: 2, Type: DRAM, Flags: regionSHM, Base: 0x7f1000000000, Len: 4096, SHM: "/dev/shm/gccl-p2p-abc-0-buf0"},
			{ID: 3, Type: FILE, Flags: regionDirect, Base: 0, Len: 1 << 40},
			{ID: 4, Type: VRAM, Flags: regionIPC, Base: 0x7f2000001000, Len: 1 << 20, Dev: 1, Bus: "0000:3c:00.0", IPCOff: 4096},
			{ID: 5, Type: VRAM, Base: 0x7f3000000000, Len: 64, Dev: 0}, // no IPC handle
		}}
	copy(m.Token[:], "0123456789abcdef")
	copy(m.Regions[3].IPC[:], "fakecuda-ipc-v1\x00 and the rest of a 64-byte handle")
	return m
}

func TestMetadataRoundTrip(t *testing.T) {
	m := sampleInfo()
	blob := encodeMetadata(m)
	got, err := decodeMetadata(blob)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encodeMetadata(got), blob) || got.Name != m.Name || len(got.Regions) != 5 || got.Regions[1].SHM != m.Regions[1].SHM || got.Token != m.Token ||
		got.Regions[3] != m.Regions[3] || got.Regions[4] != m.Regions[4] {
		t.Fatalf("round trip changed the metadata: %+v", got)
	}
	// Every truncation and every single-byte change is refused.
	for i := 0; i < len(blob); i++ {
		if _, err := decodeMetadata(blob[:i]); err == nil {
			t.Fatalf("truncated to %d bytes: accepted", i)
		}
		bad := append([]byte(nil), blob...)
		bad[i] ^= 0x40
		if _, err := decodeMetadata(bad); !errors.Is(err, ErrBadMetadata) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
}

func TestMetadataRefusesInconsistentFields(t *testing.T) {
	for name, mutate := range map[string]func(*agentInfo){
		"empty name":      func(m *agentInfo) { m.Name = "" },
		"long name":       func(m *agentInfo) { m.Name = string(make([]byte, maxNameLen+1)) },
		"duplicate id":    func(m *agentInfo) { m.Regions[1].ID = 1 },
		"bad type":        func(m *agentInfo) { m.Regions[0].Type = 9 },
		"empty region":    func(m *agentInfo) { m.Regions[0].Len = 0 },
		"wrapping region": func(m *agentInfo) { m.Regions[0].Base = ^uint64(0) },
		"shm flag no name": func(m *agentInfo) {
			m.Regions[1].SHM = ""
		},
		"name no shm flag": func(m *agentInfo) { m.Regions[0].SHM = "/dev/shm/x" },
		"unknown flag":     func(m *agentInfo) { m.Regions[0].Flags = 0x80 },
		"ipc flag on DRAM": func(m *agentInfo) { m.Regions[0].Flags = regionIPC },
		"shm flag on VRAM": func(m *agentInfo) { m.Regions[3].Flags |= regionSHM; m.Regions[3].SHM = "/dev/shm/gccl-p2p-x-buf0" },
		"VRAM device":      func(m *agentInfo) { m.Regions[3].Dev = maxDevices },
		"VRAM ipc offset":  func(m *agentInfo) { m.Regions[3].IPCOff = ^uint64(0) },
		"long bus id":      func(m *agentInfo) { m.Regions[3].Bus = strings.Repeat("0", maxBusIDLen+1) },
	} {
		m := sampleInfo()
		mutate(m)
		if _, err := decodeMetadata(encodeMetadata(m)); !errors.Is(err, ErrBadMetadata) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzMetadata(f *testing.F) {
	f.Add(encodeMetadata(sampleInfo()))
	f.Add(encodeMetadata(&agentInfo{Name: "x"}))
	f.Add([]byte(metadataMagic))
	f.Fuzz(func(t *testing.T, blob []byte) {
		m, err := decodeMetadata(blob)
		if err != nil && len(blob) >= 4 {
			// Most mutations break the checksum; parse the body as well, with
			// a checksum that matches, so the fields get fuzzed too.
			body := blob[:len(blob)-4]
			blob = binary.LittleEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, castagnoli))
			m, err = decodeMetadata(blob)
		}
		if err != nil {
			return
		}
		// Whatever parses re-encodes to the same bytes and loads into a table.
		if !bytes.Equal(encodeMetadata(m), blob) {
			t.Fatal("accepted blob does not re-encode identically")
		}
		var tb regionTable
		for _, r := range m.Regions {
			tb.add(r)
			dev := r.ID
			if r.Type == VRAM {
				dev = r.Dev
			}
			if _, err := tb.find(r.Type, r.Base, r.Len, dev); err != nil {
				t.Fatalf("region %+v not found in its own table: %v", r, err)
			}
		}
	})
}

func TestWireHeader(t *testing.T) {
	h := header{op: opWrite, region: 3, req: 99, aux: 5, offset: 4096, length: 1 << 20}
	var b [wireHeaderLen]byte
	putHeader(b[:], h)
	got, err := parseHeader(b[:])
	if err != nil || got != h {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := []header{
		{op: 0},
		{op: 99},
		{op: opWrite, offset: ^uint64(0), length: 2},
		{op: opNotif, length: maxCtrlPayload + 1},
		{op: opPing, length: 1},
		{op: opWrite, flags: flagError},
		{op: opCommit, flags: flagError},
	}
	for _, h := range bad {
		putHeader(b[:], h)
		if _, err := parseHeader(b[:]); err == nil {
			t.Errorf("accepted %+v", h)
		}
	}
	putHeader(b[:], h)
	b[0] = 0
	if _, err := parseHeader(b[:]); err == nil {
		t.Error("accepted a bad magic")
	}
	if _, err := parseHeader(b[:10]); err == nil {
		t.Error("accepted a short header")
	}
}

func FuzzWireHeader(f *testing.F) {
	for _, h := range []header{{op: opWrite, length: 10}, {op: opCommit, flags: flagAck | flagNotify, length: 3}, {op: opReadResp, flags: flagError}} {
		var b [wireHeaderLen]byte
		putHeader(b[:], h)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		var out [wireHeaderLen]byte
		putHeader(out[:], h)
		if !bytes.Equal(out[:], b[:wireHeaderLen]) {
			t.Fatal("accepted header does not re-encode identically")
		}
		if h.offset+h.length < h.offset {
			t.Fatal("accepted a wrapping range")
		}
		if (h.op == opHello || h.op == opNotif || h.op == opAck || h.op == opCommit) && h.length > maxCtrlPayload {
			t.Fatal("accepted an oversized control payload")
		}
	})
}

func TestSelectBackend(t *testing.T) {
	cases := []struct {
		pl     placement
		forced Backend
		want   Backend
		err    bool
	}{
		{placement{self: true, remoteType: FILE}, 0, BackendFile, false},
		{placement{self: true, remoteType: DRAM}, 0, BackendLocal, false},
		{placement{remoteType: FILE, sameHost: true, allMapped: true}, 0, BackendTCP, false},
		{placement{remoteType: DRAM, sameHost: true, allMapped: true, pvm: true}, 0, BackendSHM, false},
		{placement{remoteType: DRAM, sameHost: true, allMapped: true, pvm: true, shmOff: true}, 0, BackendPVM, false},
		{placement{remoteType: DRAM, sameHost: true, pvm: true}, 0, BackendPVM, false},
		{placement{remoteType: DRAM, sameHost: true}, 0, BackendTCP, false},
		{placement{remoteType: DRAM}, 0, BackendTCP, false},
		{placement{remoteType: DRAM, sameHost: true, allMapped: true}, BackendTCP, BackendTCP, false},
		{placement{remoteType: DRAM}, BackendSHM, 0, true},
		{placement{self: true, remoteType: FILE}, BackendTCP, 0, true},
		// VRAM.
		{placement{self: true, localType: VRAM, remoteType: FILE}, 0, BackendFile, false},
		{placement{self: true, localType: VRAM, remoteType: VRAM}, 0, BackendLocal, false},
		{placement{self: true, localType: DRAM, remoteType: VRAM}, 0, BackendLocal, false},
		{placement{remoteType: VRAM, sameHost: true, allMapped: true}, 0, BackendCUDAIPC, false},
		{placement{localType: VRAM, remoteType: VRAM, sameHost: true, allMapped: true, pvm: true}, 0, BackendCUDAIPC, false},
		{placement{remoteType: VRAM, sameHost: true, allMapped: true, ipcOff: true}, 0, BackendTCP, false},
		{placement{remoteType: VRAM, sameHost: true, pvm: true}, 0, BackendTCP, false}, // not opened here
		{placement{remoteType: VRAM, allMapped: true}, 0, BackendTCP, false},           // another host
		{placement{remoteType: VRAM, sameHost: true, allMapped: true}, BackendTCP, BackendTCP, false},
		{placement{remoteType: VRAM, sameHost: true, allMapped: true}, BackendSHM, 0, true},
		{placement{remoteType: VRAM, sameHost: true}, BackendCUDAIPC, 0, true},
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, allMapped: true, pvm: true}, 0, BackendSHM, false},
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, pvm: true}, 0, BackendTCP, false}, // pvm cannot reach VRAM
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, pvm: true}, BackendPVM, 0, true},
		{placement{localType: VRAM, remoteType: FILE, sameHost: true}, 0, BackendTCP, false},
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, allMapped: true}, BackendCUDAIPC, 0, true},
	}
	for _, c := range cases {
		got, why, err := selectBackend(c.pl, c.forced)
		if c.err != (err != nil) || got != c.want || err == nil && why == "" {
			t.Errorf("selectBackend(%+v, %v) = %v (%q), %v; want %v", c.pl, c.forced, got, why, err, c.want)
		}
	}
}

func TestEstimateCost(t *testing.T) {
	for b := BackendLocal; b <= BackendCUDAIPC; b++ {
		small, big := estimateCost(b, 1, 4096, 1), estimateCost(b, 1, 64<<20, 1)
		many := estimateCost(b, 1000, 4096*1000, 1)
		if small <= 0 || big <= small || many <= estimateCost(b, 1, 4096*1000, 1) {
			t.Errorf("%v: 4 KiB %v, 64 MiB %v, 1000 pieces %v: not increasing", b, small, big, many)
		}
	}
	if estimateCost(BackendSHM, 1, 64<<20, 1) >= estimateCost(BackendTCP, 1, 64<<20, 1) {
		t.Error("the model ranks tcp above shm")
	}
}

func TestOverlapSpans(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ls, rs []span
		want   bool
	}{
		{"disjoint", []span{{0, 10}, {20, 30}}, []span{{10, 20}, {30, 40}}, false},
		{"one byte", []span{{0, 10}}, []span{{9, 20}}, true},
		{"inside", []span{{0, 100}}, []span{{40, 50}}, true},
		{"nested locals", []span{{0, 5}, {1, 100}}, []span{{50, 60}}, true},
		{"long local passed over", []span{{0, 10}, {200, 300}}, []span{{10, 20}, {20, 200}, {300, 400}}, false},
		{"unsorted", []span{{300, 400}, {0, 10}}, []span{{50, 60}, {350, 351}}, true},
		{"empty", nil, []span{{0, 10}}, false},
	} {
		l, r, ok := overlapSpans(tc.ls, tc.rs)
		if ok != tc.want || ok && (max(l.lo, r.lo) >= min(l.hi, r.hi)) {
			t.Errorf("%s: %v %v %v, want overlap %v", tc.name, l, r, ok, tc.want)
		}
	}
}

// TestCopyStopsBetweenBlocks: a stopper whose deadline has passed stops a
// copy after its first block (copyMin bytes or the pieces making that up),
// not before; one that never fires lets all of it through.
func TestCopyStopsBetweenBlocks(t *testing.T) {
	const k = 1 << 10
	lens := []int{512 * k, 768 * k, 2048 * k}
	pieces := func() (dst, src [][]byte) {
		for _, n := range lens {
			dst, src = append(dst, make([]byte, n)), append(src, bytes.Repeat([]byte{1}, n))
		}
		return dst, src
	}
	copied := func(dst [][]byte) int {
		n := 0
		for _, d := range dst {
			n += bytes.Count(d, []byte{1})
		}
		return n
	}
	var late stopper
	late.deadline.Store(monoNow() - 1)
	dst, src := pieces()
	copyPieces(dst, src, &late)
	if n := copied(dst); n != 1280*k || late.why.Load() != stopTimeout {
		t.Fatalf("past the deadline: %d bytes copied (want the first 1280 KiB), why %d", n, late.why.Load())
	}
	dst, src = pieces()
	copyPieces(dst, src, nil)
	if n := copied(dst); n != 3328*k {
		t.Fatalf("without a stopper: %d bytes copied", n)
	}
	// The pool: each share stops after its first block.
	p := newCopyPool(2)
	defer p.close()
	late.why.Store(0)
	dst, src = pieces()
	p.copyAll(dst, src, 3328*k, &late)
	if n := copied(dst); n == 0 || n > 4*copyMin {
		t.Fatalf("pool past the deadline: %d bytes copied", n)
	}
	// Closing stops it too, with ErrClosed.
	closing := make(chan struct{})
	close(closing)
	r := &Request{a: &Agent{}, stop: stopper{closing: closing}}
	r.stop.deadline.Store(monoNow() + int64(time.Hour))
	dst, src = pieces()
	copyPieces(dst, src, &r.stop)
	if err := r.halted(); !errors.Is(err, ErrClosed) || copied(dst) != 1280*k {
		t.Fatalf("closing: %v after %d bytes", err, copied(dst))
	}
}
