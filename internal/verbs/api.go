package verbs

import "fmt"

// DeviceAttr are an open device's limits and identity (struct
// ibv_device_attr).
type DeviceAttr struct {
	FirmwareVersion string
	NodeGUID        uint64
	VendorID        uint32
	VendorPartID    uint32
	MaxMRSize       uint64
	MaxQP           int
	MaxQPWR         int // work requests per queue
	MaxSGE          int // scatter/gather entries per work request
	MaxCQ           int
	MaxCQE          int // entries per CQ
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int // READs a QP serves at once as the responder
	MaxQPInitRdAtom int // READs a QP has outstanding as the initiator
	Ports           int
}

// PortAttr are a port's attributes (struct ibv_port_attr).
type PortAttr struct {
	State       PortState
	MaxMTU      MTU
	ActiveMTU   MTU
	GIDTableLen int
	MaxMsgSize  uint32
	LID         uint16
	SMLID       uint16
	LinkLayer   LinkLayer
	ActiveWidth uint8
	ActiveSpeed uint8
	PhysState   uint8
}

// Port is a port of an open device that QPs can use: its attributes and
// the GID its QPs use.
type Port struct {
	Device string
	Num    int
	Attr   PortAttr
	GID    GIDEntry
}

// QPOptions describe an RC QP.
type QPOptions struct {
	Port           Port // from Context.Port
	SendCQ, RecvCQ *CQ  // may be the same CQ
	// Queue depths and scatter/gather entries per request; zero takes
	// the defaults (128 requests, 4 entries).
	MaxSendWR, MaxRecvWR   int
	MaxSendSGE, MaxRecvSGE int
	// MaxInline is how many bytes a SendInline request may carry.
	MaxInline int
	// Access is what peers' RDMA operations may do through the QP;
	// zero means AccessAll.
	Access Access
	// PostBatch is how many requests one post hands the device at most
	// (longer lists are posted in pieces); zero means 64.
	PostBatch int
}

// QPCaps are a QP's actual limits (the device may grant more than asked).
type QPCaps struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInline int
}

// PostError is a post that the QP refused from one work request on: the
// first Posted requests were posted (they will complete), the rest not.
type PostError struct {
	Posted int
	Err    error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("%v (the first %d work requests were posted, the rest not)", e.Err, e.Posted)
}

func (e *PostError) Unwrap() error { return e.Err }
