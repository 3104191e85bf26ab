package verbs

import (
	"fmt"
	"strings"
)

// QPState is a queue pair's state (enum ibv_qp_state).
type QPState uint8

// The QP states. An RC QP goes RESET -> INIT -> RTR (ready to receive) ->
// RTS (ready to send); any state may go to ERR (which flushes its work
// requests) or back to RESET.
const (
	QPReset QPState = 0
	QPInit  QPState = 1
	QPRTR   QPState = 2
	QPRTS   QPState = 3
	QPSQD   QPState = 4
	QPSQE   QPState = 5
	QPErr   QPState = 6
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// CheckTransition says whether a QP may be moved from one state to another
// by the transitions gccl makes, and if not, what to do instead.
func CheckTransition(from, to QPState) error {
	switch {
	case to == QPErr || to == QPReset:
		return nil
	case from == QPReset && to == QPInit, from == QPInit && to == QPInit,
		from == QPInit && to == QPRTR, from == QPRTR && to == QPRTS, from == QPRTS && to == QPRTS:
		return nil
	case from == QPErr:
		return fmt.Errorf("a QP in ERR goes only to RESET (then INIT) or is destroyed")
	}
	next := map[QPState]string{QPReset: "INIT", QPInit: "RTR", QPRTR: "RTS"}[from]
	if next == "" {
		return fmt.Errorf("cannot go from %v to %v", from, to)
	}
	return fmt.Errorf("cannot go from %v to %v (%s first)", from, to, next)
}

// AttrMask says which fields of a QPAttr a modification sets (enum
// ibv_qp_attr_mask).
type AttrMask uint32

// The attribute mask bits gccl sets.
const (
	AttrState          AttrMask = 1 << 0
	AttrAccessFlags    AttrMask = 1 << 3
	AttrPKeyIndex      AttrMask = 1 << 4
	AttrPort           AttrMask = 1 << 5
	AttrAV             AttrMask = 1 << 7
	AttrPathMTU        AttrMask = 1 << 8
	AttrTimeout        AttrMask = 1 << 9
	AttrRetryCnt       AttrMask = 1 << 10
	AttrRNRRetry       AttrMask = 1 << 11
	AttrRQPSN          AttrMask = 1 << 12
	AttrMaxQPRdAtomic  AttrMask = 1 << 13
	AttrMinRNRTimer    AttrMask = 1 << 15
	AttrSQPSN          AttrMask = 1 << 16
	AttrMaxDestRdAtomc AttrMask = 1 << 17
	AttrDestQPN        AttrMask = 1 << 20
)

var attrMaskNames = []string{0: "STATE", 3: "ACCESS_FLAGS", 4: "PKEY_INDEX", 5: "PORT", 7: "AV", 8: "PATH_MTU",
	9: "TIMEOUT", 10: "RETRY_CNT", 11: "RNR_RETRY", 12: "RQ_PSN", 13: "MAX_QP_RD_ATOMIC", 15: "MIN_RNR_TIMER",
	16: "SQ_PSN", 17: "MAX_DEST_RD_ATOMIC", 20: "DEST_QPN"}

func (m AttrMask) String() string { return flagString(uint32(m), attrMaskNames) }

// AHAttr is the address of the peer (struct ibv_ah_attr): a GID and the
// local GID index on RoCE and routed IB (IsGlobal), a LID on IB.
type AHAttr struct {
	IsGlobal     bool
	DGID         GID
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	DLID         uint16
	SL           uint8
	Port         uint8
}

// QPAttr is one QP modification: the fields of struct ibv_qp_attr that gccl
// sets, and the mask naming those that count. It is plain data, built by
// InitAttr, RTRAttr, RTSAttr and StateAttr, so that a connection's steps can
// be printed and compared.
type QPAttr struct {
	Mask            AttrMask
	State           QPState
	PKeyIndex       uint16
	Port            uint8
	Access          Access
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
	AH              AHAttr
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	SQPSN           uint32
	MaxRdAtomic     uint8
}

// String lists the state and the fields the mask selects.
func (a QPAttr) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v mask=%v", a.State, a.Mask)
	f := func(bit AttrMask, format string, args ...any) {
		if a.Mask&bit != 0 {
			fmt.Fprintf(&b, " "+format, args...)
		}
	}
	f(AttrPKeyIndex, "pkey_index=%d", a.PKeyIndex)
	f(AttrPort, "port=%d", a.Port)
	f(AttrAccessFlags, "access=%v", a.Access)
	f(AttrPathMTU, "path_mtu=%v", a.PathMTU)
	f(AttrDestQPN, "dest_qpn=%#x", a.DestQPN)
	f(AttrRQPSN, "rq_psn=%#x", a.RQPSN)
	f(AttrMaxDestRdAtomc, "max_dest_rd_atomic=%d", a.MaxDestRdAtomic)
	f(AttrMinRNRTimer, "min_rnr_timer=%d", a.MinRNRTimer)
	if a.Mask&AttrAV != 0 {
		h := a.AH
		if h.IsGlobal {
			fmt.Fprintf(&b, " ah={global dgid=%v sgid_index=%d hop_limit=%d tclass=%d flow_label=%d sl=%d port=%d}",
				h.DGID, h.SGIDIndex, h.HopLimit, h.TrafficClass, h.FlowLabel, h.SL, h.Port)
		} else {
			fmt.Fprintf(&b, " ah={dlid=%#x sl=%d port=%d}", h.DLID, h.SL, h.Port)
		}
	}
	f(AttrTimeout, "timeout=%d", a.Timeout)
	f(AttrRetryCnt, "retry_cnt=%d", a.RetryCnt)
	f(AttrRNRRetry, "rnr_retry=%d", a.RNRRetry)
	f(AttrSQPSN, "sq_psn=%#x", a.SQPSN)
	f(AttrMaxQPRdAtomic, "max_rd_atomic=%d", a.MaxRdAtomic)
	return b.String()
}

// InitAttr moves a new QP to INIT on port with the remote access rights
// access (what peers' RDMA operations may do to memory through it).
func InitAttr(port uint8, access Access) QPAttr {
	return QPAttr{
		Mask:  AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags,
		State: QPInit, Port: port, Access: access,
	}
}

// Local is what a QP's own side contributes to its connection: the port,
// its GID, LID, MTU and link layer, the QP's receive PSN... as in its
// Endpoint, plus the GID index and the device's limits on outstanding
// READs.
type Local struct {
	Endpoint
	Port     uint8
	GIDIndex uint8
	// MaxRdAtomic is how many READs this QP may have outstanding as the
	// initiator (the device's max_qp_init_rd_atom, capped).
	MaxRdAtomic uint8
}

// RTRAttr moves a QP from INIT to RTR, addressed to the peer's QP remote.
func RTRAttr(l Local, remote Endpoint, c Config) (QPAttr, error) {
	if remote.LinkLayer != l.LinkLayer {
		return QPAttr{}, fmt.Errorf("link layers differ: %v here, %v at the peer", l.LinkLayer, remote.LinkLayer)
	}
	if remote.QPN == 0 || remote.QPN > 0xffffff {
		return QPAttr{}, fmt.Errorf("the peer's QP number %#x is not a QP number", remote.QPN)
	}
	mtu := min(l.MTU, remote.MTU)
	if mtu.Bytes() == 0 {
		return QPAttr{}, fmt.Errorf("no valid path MTU (%v here, %v at the peer)", l.MTU, remote.MTU)
	}
	ah := AHAttr{DLID: remote.LID, SL: c.SL, Port: l.Port}
	// RoCE is always routed by GID; InfiniBand by LID, unless the peer is
	// in another subnet.
	if l.LinkLayer == LinkEthernet || remote.GID.SubnetPrefix() != l.GID.SubnetPrefix() {
		if remote.GID.IsZero() {
			return QPAttr{}, fmt.Errorf("the peer sent no GID")
		}
		ah.IsGlobal = true
		ah.DGID = remote.GID
		ah.SGIDIndex = l.GIDIndex
		ah.HopLimit = hopLimit
		ah.TrafficClass = c.TrafficClass
	} else if remote.LID == 0 {
		return QPAttr{}, fmt.Errorf("the peer sent no LID (its InfiniBand port has no subnet manager?)")
	}
	return QPAttr{
		Mask:  AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomc | AttrMinRNRTimer,
		State: QPRTR, PathMTU: mtu, DestQPN: remote.QPN, RQPSN: remote.PSN & 0xffffff,
		MaxDestRdAtomic: l.RdAtomic, MinRNRTimer: minRNRTimer, AH: ah,
	}, nil
}

// RTSAttr moves a QP from RTR to RTS: its send PSN, the retry policy of c,
// and as many outstanding READs as both this side and the peer's responder
// allow.
func RTSAttr(l Local, remote Endpoint, c Config) QPAttr {
	return QPAttr{
		Mask:    AttrState | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
		State:   QPRTS,
		Timeout: c.Timeout, RetryCnt: c.RetryCnt, RNRRetry: rnrRetry,
		SQPSN: l.PSN & 0xffffff, MaxRdAtomic: max(min(l.MaxRdAtomic, remote.RdAtomic), 1),
	}
}

// StateAttr moves a QP to state s and sets nothing else (ERR, RESET).
func StateAttr(s QPState) QPAttr { return QPAttr{Mask: AttrState, State: s} }

// qpMachine is a QP's state as gccl moved it, and the function that makes
// a modification (ibv_modify_qp, or a recorder in tests).
type qpMachine struct {
	state  QPState
	modify func(QPAttr) error
}

// apply checks and makes one transition.
func (m *qpMachine) apply(a QPAttr) error {
	if err := CheckTransition(m.state, a.State); err != nil {
		return err
	}
	if err := m.modify(a); err != nil {
		return fmt.Errorf("modify to %v: %w", a.State, err)
	}
	m.state = a.State
	return nil
}

// connect makes the RTR and RTS transitions of a QP in INIT towards remote.
func (m *qpMachine) connect(l Local, remote Endpoint, c Config) error {
	if m.state != QPInit {
		return fmt.Errorf("cannot connect a QP in %v (only a new QP, in INIT)", m.state)
	}
	rtr, err := RTRAttr(l, remote, c)
	if err != nil {
		return err
	}
	if err := m.apply(rtr); err != nil {
		return err
	}
	return m.apply(RTSAttr(l, remote, c))
}
