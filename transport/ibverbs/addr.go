package ibverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/gccl/gccl/internal/verbs"
)

// portAddr is what a rank publishes in its descriptor: the port it uses,
// for Reach to tell whether two ranks share a fabric, and for the logs; and
// where its TCP fallback listens, for a pair whose RDMA fails at its first
// use. Its wire form:
//
//	offset size field
//	0      1    version (2)
//	1      1    link layer
//	2      1    GID type
//	3      1    port number
//	4      2    LID, big endian
//	6      1    active MTU code
//	7      1    QPs per connection this rank asks for
//	8      2    GID index, big endian
//	10     6    reserved, zero
//	16     16   GID
//	32     1    length of the device name
//	33     n    device name
//	33+n   1    length of the fallback's address (0: none)
//	34+n   ...  the fallback's TCP address (host:port)
type portAddr struct {
	Device    string
	Port      int
	LinkLayer verbs.LinkLayer
	GIDType   verbs.GIDType
	GIDIndex  int
	GID       verbs.GID
	LID       uint16
	MTU       verbs.MTU
	QPs       int
	TCP       string // the fallback's listening address; "" when it has none
}

const addrVersion = 2

// Name is "device:port".
func (a portAddr) Name() string { return a.Device + ":" + strconv.Itoa(a.Port) }

// Fabric describes the port's network for the logs: "RoCE v2" or
// "InfiniBand".
func (a portAddr) Fabric() string {
	if a.LinkLayer == verbs.LinkEthernet {
		if a.GIDType == verbs.GIDRoCEv2 {
			return "RoCE v2"
		}
		return "RoCE v1"
	}
	return a.LinkLayer.String()
}

func (a portAddr) marshal() []byte {
	b := make([]byte, 33, 34+len(a.Device)+len(a.TCP))
	b[0] = addrVersion
	b[1] = byte(a.LinkLayer)
	b[2] = byte(a.GIDType)
	b[3] = byte(a.Port)
	binary.BigEndian.PutUint16(b[4:], a.LID)
	b[6] = byte(a.MTU)
	b[7] = byte(a.QPs)
	binary.BigEndian.PutUint16(b[8:], uint16(a.GIDIndex))
	copy(b[16:32], a.GID[:])
	b[32] = byte(len(a.Device))
	b = append(b, a.Device...)
	b = append(b, byte(len(a.TCP)))
	return append(b, a.TCP...)
}

// parseAddr reads another rank's portAddr, checking every field.
func parseAddr(b []byte) (portAddr, error) {
	if len(b) < 33 || b[0] != addrVersion {
		return portAddr{}, errors.New("ibverbs: bad port address (is every rank running the same gccl?)")
	}
	a := portAddr{
		LinkLayer: verbs.LinkLayer(b[1]), GIDType: verbs.GIDType(b[2]), Port: int(b[3]),
		LID: binary.BigEndian.Uint16(b[4:]), MTU: verbs.MTU(b[6]), QPs: int(b[7]), GIDIndex: int(binary.BigEndian.Uint16(b[8:])),
	}
	copy(a.GID[:], b[16:32])
	n := int(b[32])
	switch {
	case len(b) < 34+n || n == 0:
		return portAddr{}, errors.New("ibverbs: bad device name in a port address")
	case len(b) != 34+n+int(b[33+n]):
		return portAddr{}, errors.New("ibverbs: bad fallback address in a port address")
	case a.LinkLayer != verbs.LinkInfiniBand && a.LinkLayer != verbs.LinkEthernet:
		return portAddr{}, fmt.Errorf("ibverbs: bad link layer %d in a port address", b[1])
	case a.MTU.Bytes() == 0 || a.Port < 1 || a.QPs < 1 || a.QPs > MaxQPs:
		return portAddr{}, errors.New("ibverbs: bad port, MTU or QP count in a port address")
	}
	a.Device = string(b[33 : 33+n])
	a.TCP = string(b[34+n:])
	return a, nil
}

// pairInfo is what one side of a pair publishes through the job's store
// once it has set up its half of the connection: its QPs, where its
// memory is and the geometry it assumes; or why it could not.
//
//	offset size field
//	0      4    magic "gIB1"
//	4      1    0: ok, 1: failed (a reason follows instead)
//	5      1    QPs
//	6      2    reserved
//	8      4    slot size
//	12     4    slot count
//	16     8    address of the region
//	24     4    its remote key
//	28     4    reserved
//	32     32×QPs  the QPs' endpoints (verbs.Endpoint's wire form)
type pairInfo struct {
	Failed    string // non-empty: this side could not set up the pair, and why
	SlotSize  int
	Count     int
	Addr      uint64
	RKey      uint32
	Endpoints []verbs.Endpoint
}

const infoMagic = "gIB1"

func (p pairInfo) marshal() []byte {
	b := make([]byte, 32, 32+len(p.Endpoints)*verbs.EndpointSize)
	copy(b, infoMagic)
	if p.Failed != "" {
		b[4] = 1
		return append(b[:5], p.Failed...)
	}
	b[5] = byte(len(p.Endpoints))
	binary.BigEndian.PutUint32(b[8:], uint32(p.SlotSize))
	binary.BigEndian.PutUint32(b[12:], uint32(p.Count))
	binary.BigEndian.PutUint64(b[16:], p.Addr)
	binary.BigEndian.PutUint32(b[24:], p.RKey)
	for _, e := range p.Endpoints {
		b, _ = e.AppendBinary(b)
	}
	return b
}

func parsePairInfo(b []byte) (pairInfo, error) {
	if len(b) < 5 || string(b[:4]) != infoMagic {
		return pairInfo{}, errors.New("ibverbs: bad connection info from the peer (is every rank running the same gccl?)")
	}
	if b[4] == 1 {
		return pairInfo{Failed: string(b[5:])}, nil
	}
	if len(b) < 32 || b[4] != 0 {
		return pairInfo{}, errors.New("ibverbs: truncated connection info from the peer")
	}
	n := int(b[5])
	if n < 1 || n > MaxQPs || len(b) != 32+n*verbs.EndpointSize {
		return pairInfo{}, fmt.Errorf("ibverbs: connection info with %d QPs in %d bytes", n, len(b))
	}
	p := pairInfo{SlotSize: int(binary.BigEndian.Uint32(b[8:])), Count: int(binary.BigEndian.Uint32(b[12:])),
		Addr: binary.BigEndian.Uint64(b[16:]), RKey: binary.BigEndian.Uint32(b[24:])}
	for i := range n {
		var e verbs.Endpoint
		if err := e.UnmarshalBinary(b[32+i*verbs.EndpointSize : 32+(i+1)*verbs.EndpointSize]); err != nil {
			return pairInfo{}, err
		}
		p.Endpoints = append(p.Endpoints, e)
	}
	return p, nil
}
