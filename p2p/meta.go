package p2p

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/gccl/gccl/internal/verbs"
)

// Metadata blob, version 3 (version 1 had no VRAM record tail, version 2
// no RDMA port and keys). Integers are little endian; strings are a u16
// length and bytes. A CRC-32C of everything before it ends the blob, so a
// truncated or damaged blob is refused before any field is trusted.
//
//	magic    8   "GCCLP2P\x00"
//	version  2   metadataVersion
//	reserved 2   zero
//	gen      8   bumped by every (de)registration; a newer blob replaces an older
//	name     str agent name
//	host     str host identity (hostname and boot id): same value, same host
//	addr     str host:port of the agent's listener, "" when it has none
//	pid      4
//	token    16  random; a connecting peer must present it (proof it loaded the blob)
//	probe    8   address of the token in the agent's memory (pvm probe)
//	rdma     1   1 if the agent has an RDMA port, then: device str, port 1,
//	             link layer 1, active MTU 1, LID 2, GID 16
//	count    4   regions, then per region:
//	  id 4, type 1, flags 1, base 8, len 8, shm str, and for VRAM:
//	  dev 4 (the owner's device ordinal), bus str (its PCI bus id),
//	  ipc 64 (CUDA IPC handle of the allocation, when flags&regionIPC),
//	  ipcoff 8 (offset of base in that allocation);
//	  and for DRAM and VRAM: keys 2, then per MR of the region (in order,
//	  covering it from offset 0 to len, none when it is not registered with
//	  the agent's RDMA device): off 8, len 8, rkey 4
//	crc      4
const (
	metadataMagic   = "GCCLP2P\x00"
	metadataVersion = 3
	maxNameLen      = 256
	maxStringLen    = 1024
	// maxMetadataLen bounds a blob: it must fit in a hello (with the
	// token), however it reached this agent (hello or KV store), so that
	// what a peer's blob makes this agent allocate (about 6 times its
	// size, in regions) stays bounded.
	maxMetadataLen = maxCtrlPayload - tokenLen
	// maxRegions bounds the regions of one blob; maxMetadataLen admits
	// fewer (43,690 of the smallest records), this says so in the error.
	maxRegions      = 1 << 16
	tokenLen        = 16
	regionRecordMin = 4 + 1 + 1 + 8 + 8 + 2
	ipcHandleLen    = 64
	maxDevices      = 1 << 12
	maxBusIDLen     = 64
	maxRegionKeys   = 1 << 12
)

// agentInfo is a decoded metadata blob.
type agentInfo struct {
	Gen     uint64
	Name    string
	Host    string
	Addr    string
	Pid     uint32
	Token   [tokenLen]byte
	Probe   uint64
	RDMA    *rdmaInfo // nil: no RDMA port
	Regions []regionInfo
	// Keys are the RDMA keys of the regions registered with the agent's
	// device, by region ID.
	Keys map[uint32][]rkeyRange
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encodeMetadata(m *agentInfo) []byte {
	b := make([]byte, 0, 128+len(m.Regions)*48)
	b = append(b, metadataMagic...)
	b = binary.LittleEndian.AppendUint16(b, metadataVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint64(b, m.Gen)
	b = appendString(b, m.Name)
	b = appendString(b, m.Host)
	b = appendString(b, m.Addr)
	b = binary.LittleEndian.AppendUint32(b, m.Pid)
	b = append(b, m.Token[:]...)
	b = binary.LittleEndian.AppendUint64(b, m.Probe)
	if r := m.RDMA; r != nil {
		b = append(b, 1)
		b = appendString(b, r.Device)
		b = append(b, r.Port, byte(r.LinkLayer), byte(r.MTU))
		b = binary.LittleEndian.AppendUint16(b, r.LID)
		b = append(b, r.GID[:]...)
	} else {
		b = append(b, 0)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Regions)))
	for _, r := range m.Regions {
		b = binary.LittleEndian.AppendUint32(b, r.ID)
		b = append(b, byte(r.Type), r.Flags)
		b = binary.LittleEndian.AppendUint64(b, r.Base)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = appendString(b, r.SHM)
		if r.Type == VRAM {
			b = binary.LittleEndian.AppendUint32(b, r.Dev)
			b = appendString(b, r.Bus)
			b = append(b, r.IPC[:]...)
			b = binary.LittleEndian.AppendUint64(b, r.IPCOff)
		}
		if r.Type != FILE {
			keys := m.Keys[r.ID]
			b = binary.LittleEndian.AppendUint16(b, uint16(len(keys)))
			for _, k := range keys {
				b = binary.LittleEndian.AppendUint64(b, k.Off)
				b = binary.LittleEndian.AppendUint64(b, k.Len)
				b = binary.LittleEndian.AppendUint32(b, k.RKey)
			}
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// decoder reads fields and remembers the first error; reads after an error
// return zero values, so parsing code stays linear.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrBadMetadata}, args...)...)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("%s: need %d bytes, %d left", what, n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8(what string) uint8 {
	if v := d.take(1, what); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u16(what string) uint16 {
	if v := d.take(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32(what string) uint32 {
	if v := d.take(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64(what string) uint64 {
	if v := d.take(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) str(what string, limit int) string {
	n := int(d.u16(what))
	if n > limit {
		d.fail("%s of %d bytes (at most %d)", what, n, limit)
		return ""
	}
	return string(d.take(n, what))
}

// decodeKeys reads a region's RDMA keys: MRs covering it in order.
func decodeKeys(d *decoder, r regionInfo) []rkeyRange {
	n := int(d.u16("region key count"))
	if d.err != nil {
		return nil
	}
	if n > maxRegionKeys || n*20 > len(d.b) {
		d.fail("region %d: %d keys in %d bytes", r.ID, n, len(d.b))
		return nil
	}
	var keys []rkeyRange
	next := uint64(0)
	for i := 0; i < n && d.err == nil; i++ {
		k := rkeyRange{Off: d.u64("key offset"), Len: d.u64("key length"), RKey: d.u32("rkey")}
		if d.err == nil && (k.Off != next || k.Len == 0 || k.Off+k.Len < k.Off || k.Off+k.Len > r.Len) {
			d.fail("region %d: key %d covers [%#x, +%d), expected it from %#x within %d bytes", r.ID, i, k.Off, k.Len, next, r.Len)
		}
		next = k.Off + k.Len
		keys = append(keys, k)
	}
	if d.err == nil && n > 0 && next != r.Len {
		d.fail("region %d: keys cover %d of %d bytes", r.ID, next, r.Len)
	}
	return keys
}

// decodeMetadata parses a blob from a peer, checking every field it will
// later rely on.
func decodeMetadata(blob []byte) (*agentInfo, error) {
	if len(blob) < len(metadataMagic)+4+4 {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadMetadata, len(blob))
	}
	if len(blob) > maxMetadataLen {
		return nil, fmt.Errorf("%w: a blob of %d bytes (at most %d)", ErrBadMetadata, len(blob), maxMetadataLen)
	}
	body, sum := blob[:len(blob)-4], binary.LittleEndian.Uint32(blob[len(blob)-4:])
	if string(body[:len(metadataMagic)]) != metadataMagic {
		return nil, fmt.Errorf("%w: not a gccl p2p metadata blob", ErrBadMetadata)
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("%w: checksum %#08x, blob says %#08x (truncated or damaged)", ErrBadMetadata, got, sum)
	}
	d := &decoder{b: body[len(metadataMagic):]}
	if v := d.u16("version"); v != metadataVersion {
		return nil, fmt.Errorf("%w: version %d (this agent reads version %d)", ErrBadMetadata, v, metadataVersion)
	}
	if d.u16("reserved") != 0 {
		d.fail("reserved field set")
	}
	m := &agentInfo{}
	m.Gen = d.u64("generation")
	m.Name = d.str("name", maxNameLen)
	m.Host = d.str("host", maxStringLen)
	m.Addr = d.str("address", maxStringLen)
	m.Pid = d.u32("pid")
	copy(m.Token[:], d.take(tokenLen, "token"))
	m.Probe = d.u64("probe address")
	switch d.u8("rdma flag") {
	case 0:
	case 1:
		r := &rdmaInfo{Device: d.str("rdma device", maxNameLen), Port: d.u8("rdma port"),
			LinkLayer: verbs.LinkLayer(d.u8("rdma link layer")), MTU: verbs.MTU(d.u8("rdma MTU")), LID: d.u16("rdma LID")}
		copy(r.GID[:], d.take(len(r.GID), "rdma GID"))
		if d.err == nil && (r.Device == "" || r.Port == 0 || r.MTU.Bytes() == 0 ||
			r.LinkLayer != verbs.LinkInfiniBand && r.LinkLayer != verbs.LinkEthernet) {
			d.fail("rdma port %+v", *r)
		}
		m.RDMA = r
	default:
		d.fail("rdma flag")
	}
	n := d.u32("region count")
	if d.err == nil && (n > maxRegions || int(n) > len(d.b)/regionRecordMin) {
		d.fail("%d regions in %d bytes (at most %d regions)", n, len(d.b), maxRegions)
	}
	if d.err == nil {
		m.Regions = make([]regionInfo, 0, n)
	}
	seen := map[uint32]bool{}
	for i := 0; i < int(n) && d.err == nil; i++ {
		r := regionInfo{ID: d.u32("region id"), Type: MemType(d.u8("region type")), Flags: d.u8("region flags")}
		r.Base, r.Len = d.u64("region base"), d.u64("region length")
		r.SHM = d.str("region segment", maxStringLen)
		if r.Type == VRAM {
			r.Dev = d.u32("region device")
			r.Bus = d.str("region PCI bus id", maxBusIDLen)
			copy(r.IPC[:], d.take(ipcHandleLen, "region IPC handle"))
			r.IPCOff = d.u64("region IPC offset")
		}
		if r.Type == DRAM || r.Type == VRAM {
			if k := decodeKeys(d, r); len(k) > 0 {
				if m.Keys == nil {
					m.Keys = map[uint32][]rkeyRange{}
				}
				m.Keys[r.ID] = k
			}
		}
		switch {
		case d.err != nil:
		case r.Type != DRAM && r.Type != FILE && r.Type != VRAM:
			d.fail("region %d has memory type %d", r.ID, r.Type)
		case r.Len == 0 || r.Base+r.Len < r.Base:
			d.fail("region %d: [%#x, +%d) is empty or wraps", r.ID, r.Base, r.Len)
		case r.Flags&^(regionSHM|regionDirect|regionIPC) != 0:
			d.fail("region %d: unknown flags %#x", r.ID, r.Flags)
		case r.Type == VRAM && r.Flags&(regionSHM|regionDirect) != 0, r.Type != VRAM && r.Flags&regionIPC != 0:
			d.fail("region %d: flags %#x do not fit memory type %v", r.ID, r.Flags, r.Type)
		case r.Type == VRAM && (r.Dev >= maxDevices || r.IPCOff+r.Len < r.IPCOff):
			d.fail("region %d: device %d, IPC offset %#x", r.ID, r.Dev, r.IPCOff)
		case (r.Flags&regionSHM != 0) != (r.SHM != ""):
			d.fail("region %d: shared flag and segment name %q disagree", r.ID, r.SHM)
		case seen[r.ID]:
			d.fail("region id %d appears twice", r.ID)
		}
		seen[r.ID] = true
		m.Regions = append(m.Regions, r)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err == nil && m.Name == "" {
		d.fail("empty agent name")
	}
	if d.err != nil {
		if m.Name != "" {
			// Name the peer whose blob it is, once its name was read.
			return nil, fmt.Errorf("%w (metadata of agent %q)", d.err, truncateName(m.Name))
		}
		return nil, d.err
	}
	return m, nil
}

// truncateName shortens a peer-chosen name for an error message.
func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
