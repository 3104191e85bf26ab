package verbs

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strings"
)

// MTU is a path MTU code (enum ibv_mtu).
type MTU uint8

// The MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes, 0 for an unknown code.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string {
	if b := m.Bytes(); b > 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// PortState is a port's logical state (enum ibv_port_state).
type PortState uint8

// The port states gccl tests for.
const (
	PortNOP    PortState = 0
	PortDown   PortState = 1
	PortInit   PortState = 2
	PortArmed  PortState = 3
	PortActive PortState = 4
)

var portStateNames = [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

func (s PortState) String() string {
	if int(s) < len(portStateNames) {
		return portStateNames[s]
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// LinkLayer is a port's link layer.
type LinkLayer uint8

// The link layers (IBV_LINK_LAYER_*).
const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand:
		return "InfiniBand"
	case LinkEthernet:
		return "Ethernet"
	case LinkUnspecified:
		return "unspecified"
	}
	return fmt.Sprintf("LinkLayer(%d)", uint8(l))
}

// parseLinkLayer reads sysfs' ports/N/link_layer ("InfiniBand", "Ethernet").
func parseLinkLayer(s string) LinkLayer {
	switch strings.TrimSpace(s) {
	case "InfiniBand":
		return LinkInfiniBand
	case "Ethernet":
		return LinkEthernet
	}
	return LinkUnspecified
}

// Access is a set of memory and QP access rights (enum ibv_access_flags).
type Access uint32

// The access rights.
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3

	// AccessAll is what a transport's buffers need: the NIC writes them
	// locally (receives, READ results) and peers write and read them.
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
)

func (a Access) String() string {
	return flagString(uint32(a), []string{"LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC"})
}

// flagString names the set bits of v with names[bit], "|"-separated; bits
// without a name print as hex.
func flagString(v uint32, names []string) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	for b := 0; v != 0; b++ {
		if v&1 != 0 {
			if b < len(names) && names[b] != "" {
				parts = append(parts, names[b])
			} else {
				parts = append(parts, fmt.Sprintf("0x%x", uint32(1)<<b))
			}
		}
		v >>= 1
	}
	return strings.Join(parts, "|")
}

// Opcode is a send work request's operation (enum ibv_wr_opcode).
type Opcode uint32

// The operations gccl posts.
const (
	OpWrite        Opcode = 0 // RDMA WRITE
	OpWriteWithImm Opcode = 1 // RDMA WRITE with immediate: consumes a receive at the peer
	OpSend         Opcode = 2 // SEND into a receive posted by the peer
	OpSendWithImm  Opcode = 3 // SEND with immediate
	OpRead         Opcode = 4 // RDMA READ
)

var opcodeNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ"}

func (o Opcode) String() string {
	if int(o) < len(opcodeNames) {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint32(o))
}

// remote reports whether the operation addresses the peer's memory.
func (o Opcode) remote() bool { return o == OpWrite || o == OpWriteWithImm || o == OpRead }

// SendFlags are a send work request's flags (enum ibv_send_flags).
type SendFlags uint32

// The send flags.
const (
	// SendFence waits for earlier READs of the QP before this request.
	SendFence SendFlags = 1 << 0
	// SendSignaled asks for a completion (the QP signals only these).
	SendSignaled SendFlags = 1 << 1
	// SendSolicited sets the solicited event bit at the receiver.
	SendSolicited SendFlags = 1 << 2
	// SendInline copies the data into the request: its memory needs no
	// registration and may be reused as soon as the post returns. At
	// most QP.MaxInline bytes.
	SendInline SendFlags = 1 << 3
)

func (f SendFlags) String() string {
	return flagString(uint32(f), []string{"FENCE", "SIGNALED", "SOLICITED", "INLINE"})
}

// WCStatus is a work completion's status (enum ibv_wc_status).
type WCStatus uint32

// The statuses gccl tests for.
const (
	WCSuccess       WCStatus = 0
	WCLocLenErr     WCStatus = 1
	WCLocProtErr    WCStatus = 4
	WCFlushErr      WCStatus = 5
	WCLocAccessErr  WCStatus = 8
	WCRemInvReqErr  WCStatus = 9
	WCRemAccessErr  WCStatus = 10
	WCRemOpErr      WCStatus = 11
	WCRetryExcErr   WCStatus = 12
	WCRNRRetryExErr WCStatus = 13
	WCFatalErr      WCStatus = 19
	WCGeneralErr    WCStatus = 21
)

// wcStatusNames are libibverbs' ibv_wc_status_str texts
// (TestStatusNamesMatchLibrary compares them with the installed library).
var wcStatusNames = [...]string{
	"success",
	"local length error",
	"local QP operation error",
	"local EE context operation error",
	"local protection error",
	"Work Request Flushed Error",
	"memory management operation error",
	"bad response error",
	"local access error",
	"remote invalid request error",
	"remote access error",
	"remote operation error",
	"transport retry counter exceeded",
	"RNR retry counter exceeded",
	"local RDD violation error",
	"remote invalid RD request",
	"aborted error",
	"invalid EE context number",
	"invalid EE context state",
	"fatal error",
	"response timeout error",
	"general error",
	"TM error",
	"TM software rendezvous",
}

// String is the status as ibv_wc_status_str names it.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "unknown"
}

// WCOpcode is a work completion's operation (enum ibv_wc_opcode).
type WCOpcode uint32

// The completion operations.
const (
	WCSend            WCOpcode = 0
	WCWrite           WCOpcode = 1
	WCRead            WCOpcode = 2
	WCRecv            WCOpcode = 1 << 7 // a receive consumed by a SEND
	WCRecvRDMAWithImm WCOpcode = WCRecv + 1
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCWrite:
		return "RDMA_WRITE"
	case WCRead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags are a work completion's flags (enum ibv_wc_flags).
type WCFlags uint32

// The completion flags.
const (
	WCWithGRH WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1 // Imm holds the sender's immediate
)

// SGE is one piece of a scatter/gather list: Length bytes at Addr in the
// memory region whose local key is LKey. Its layout is struct ibv_sge's.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WC is a work completion. Its layout is struct ibv_wc's, except that Imm
// is in host byte order (CQ.Poll converts it).
type WC struct {
	WRID      uint64   // the work request's ID
	Status    WCStatus // WCSuccess, or why it failed
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32 // bytes received (receives)
	Imm       uint32 // the immediate, when Flags has WCWithImm
	QPNum     uint32 // the local QP
	SrcQP     uint32
	Flags     WCFlags
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
	DLIDBits  uint8
}

// fixImm turns the immediate of a completion from network to host byte
// order.
func (w *WC) fixImm() {
	if w.Flags&WCWithImm != 0 {
		w.Imm = bits.ReverseBytes32(w.Imm)
	}
}

// SendWR is a send work request: Op on the local memory in SGEs and, for
// RDMA operations, the peer's memory at RemoteAddr under RKey.
type SendWR struct {
	ID         uint64 // returned in the completion's WRID
	Op         Opcode
	Flags      SendFlags
	Imm        uint32 // the immediate (host byte order) of the *WithImm operations
	RemoteAddr uint64
	RKey       uint32
	SGEs       []SGE // gathered for WRITE and SEND, scattered into for READ
}

// RecvWR is a receive work request: a SEND's bytes are scattered into
// SGEs; a WRITE with immediate consumes one without using its SGEs (it
// may have none).
type RecvWR struct {
	ID   uint64
	SGEs []SGE
}

// GID is a port's 128-bit global identifier (union ibv_gid). On RoCE it is
// an IPv6 address, or an IPv4 address mapped into IPv6 (::ffff:a.b.c.d).
type GID [16]byte

// IsZero reports whether the GID is all zeros (an unused table entry).
func (g GID) IsZero() bool { return g == GID{} }

// IPv4Mapped reports whether the GID is an IPv4-mapped address
// (::ffff:a.b.c.d), what RoCE v2 uses for an interface's IPv4 address.
func (g GID) IPv4Mapped() bool { return netip.AddrFrom16(g).Is4In6() }

// linkLocal reports whether the GID is an IPv6 link-local address
// (fe80::/10), the default GID every RoCE port has.
func (g GID) linkLocal() bool { return g[0] == 0xfe && g[1]&0xc0 == 0x80 }

// SubnetPrefix is the GID's upper 64 bits (the IB subnet).
func (g GID) SubnetPrefix() uint64 {
	var p uint64
	for _, b := range g[:8] {
		p = p<<8 | uint64(b)
	}
	return p
}

// String writes the GID as an IP address (::ffff:10.0.0.1, fe80::1).
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// ParseGID reads a GID as sysfs writes it
// ("fe80:0000:0000:0000:5054:00ff:fe12:3456") or as an IPv6 address.
func ParseGID(s string) (GID, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || !a.Is6() && !a.Is4() {
		return GID{}, fmt.Errorf("verbs: bad GID %q", s)
	}
	return GID(netip.AddrFrom16(a.As16()).As16()), nil
}
