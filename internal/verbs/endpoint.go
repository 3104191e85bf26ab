package verbs

import (
	"encoding/binary"
	"fmt"
)

// Endpoint is what the peer of an RC QP needs to connect its own QP to it,
// exchanged out of band (the bootstrap) before QP.Connect. It marshals to
// EndpointSize bytes.
type Endpoint struct {
	QPN       uint32 // 24 bits
	PSN       uint32 // the first packet sequence number it sends (24 bits)
	LID       uint16 // its port's LID (InfiniBand)
	GID       GID    // its port's GID (RoCE, routed InfiniBand)
	MTU       MTU    // its port's active MTU; the path uses the smaller
	LinkLayer LinkLayer
	// RdAtomic is how many READs it serves at once as the responder; the
	// peer issues no more than that.
	RdAtomic uint8
}

// EndpointSize is the length of a marshalled Endpoint.
const EndpointSize = 32

const endpointVersion = 1

func (e Endpoint) String() string {
	return fmt.Sprintf("QP %#x psn %#x lid %#x gid %v mtu %v %v rd_atomic %d", e.QPN, e.PSN, e.LID, e.GID, e.MTU, e.LinkLayer, e.RdAtomic)
}

// AppendBinary appends the endpoint's wire form to b.
func (e Endpoint) AppendBinary(b []byte) ([]byte, error) {
	var w [EndpointSize]byte
	w[0] = endpointVersion
	w[1] = byte(e.LinkLayer)
	w[2] = byte(e.MTU)
	w[3] = e.RdAtomic
	binary.BigEndian.PutUint32(w[4:], e.QPN)
	binary.BigEndian.PutUint32(w[8:], e.PSN)
	binary.BigEndian.PutUint16(w[12:], e.LID)
	copy(w[16:], e.GID[:])
	return append(b, w[:]...), nil
}

// MarshalBinary returns the endpoint's wire form.
func (e Endpoint) MarshalBinary() ([]byte, error) {
	return e.AppendBinary(make([]byte, 0, EndpointSize))
}

// UnmarshalBinary reads an endpoint from its wire form, checking every
// field: the bytes come from the network.
func (e *Endpoint) UnmarshalBinary(b []byte) error {
	if len(b) != EndpointSize {
		return fmt.Errorf("verbs: endpoint: %d bytes, want %d", len(b), EndpointSize)
	}
	if b[0] != endpointVersion {
		return fmt.Errorf("verbs: endpoint: version %d, want %d (a peer running another gccl?)", b[0], endpointVersion)
	}
	d := Endpoint{
		LinkLayer: LinkLayer(b[1]), MTU: MTU(b[2]), RdAtomic: b[3],
		QPN: binary.BigEndian.Uint32(b[4:]), PSN: binary.BigEndian.Uint32(b[8:]), LID: binary.BigEndian.Uint16(b[12:]),
	}
	copy(d.GID[:], b[16:])
	switch {
	case d.LinkLayer != LinkInfiniBand && d.LinkLayer != LinkEthernet:
		return fmt.Errorf("verbs: endpoint: bad link layer %d", b[1])
	case d.MTU.Bytes() == 0:
		return fmt.Errorf("verbs: endpoint: bad MTU code %d", b[2])
	case d.QPN == 0 || d.QPN > 0xffffff:
		return fmt.Errorf("verbs: endpoint: bad QP number %#x", d.QPN)
	case d.PSN > 0xffffff:
		return fmt.Errorf("verbs: endpoint: bad PSN %#x", d.PSN)
	case b[14] != 0 || b[15] != 0:
		return fmt.Errorf("verbs: endpoint: reserved bytes set")
	}
	*e = d
	return nil
}
