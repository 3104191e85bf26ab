package p2p

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

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
