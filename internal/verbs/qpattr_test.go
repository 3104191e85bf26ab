package verbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a QP's modify function that records each modification and
// fails the one at failAt (1-based; 0: none).
type recorder struct {
	got    []string
	failAt int
}

func (r *recorder) modify(a QPAttr) error {
	r.got = append(r.got, a.String())
	if len(r.got) == r.failAt {
		return errors.New("Invalid argument")
	}
	return nil
}

func roceLocal(t *testing.T) Local {
	return Local{
		Endpoint: Endpoint{QPN: 0x11, PSN: 0xabcdef, GID: mustGID(t, "::ffff:169.254.77.1"), MTU: MTU1024,
			LinkLayer: LinkEthernet, RdAtomic: 16},
		Port: 1, GIDIndex: 3, MaxRdAtomic: 8,
	}
}

func roceRemote(t *testing.T) Endpoint {
	return Endpoint{QPN: 0x12, PSN: 0x123456, GID: mustGID(t, "::ffff:169.254.77.2"), MTU: MTU4096,
		LinkLayer: LinkEthernet, RdAtomic: 4}
}

// The attributes of a RoCE connection, as ibv_modify_qp receives them,
// from INIT to RTS: the recorded steps are the contract with the device.
func TestConnectRecordedRoCE(t *testing.T) {
	r := &recorder{}
	m := qpMachine{modify: r.modify}
	cfg := DefaultConfig()
	cfg.TrafficClass, cfg.SL = 106, 3
	require.NoError(t, m.apply(InitAttr(1, AccessAll)))
	require.NoError(t, m.connect(roceLocal(t), roceRemote(t), cfg))
	require.Equal(t, QPRTS, m.state)
	require.Equal(t, []string{
		"INIT mask=STATE|ACCESS_FLAGS|PKEY_INDEX|PORT pkey_index=0 port=1 access=LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ",
		"RTR mask=STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN path_mtu=1024 dest_qpn=0x12 rq_psn=0x123456 " +
			"max_dest_rd_atomic=16 min_rnr_timer=12 ah={global dgid=::ffff:169.254.77.2 sgid_index=3 hop_limit=255 tclass=106 flow_label=0 sl=3 port=1}",
		"RTS mask=STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN timeout=20 retry_cnt=7 rnr_retry=7 sq_psn=0xabcdef max_rd_atomic=4",
	}, r.got)

	// Moving to ERR and back to RESET is always allowed.
	require.NoError(t, m.apply(StateAttr(QPErr)))
	require.Equal(t, "ERR mask=STATE", r.got[3])
	require.NoError(t, m.apply(StateAttr(QPReset)))
}

func TestConnectRecordedIB(t *testing.T) {
	l := Local{Endpoint: Endpoint{QPN: 0x200, PSN: 5, LID: 7, GID: mustGID(t, "fe80::1"), MTU: MTU4096, LinkLayer: LinkInfiniBand, RdAtomic: 16},
		Port: 2, MaxRdAtomic: 16}
	remote := Endpoint{QPN: 0x300, PSN: 9, LID: 12, GID: mustGID(t, "fe80::2"), MTU: MTU2048, LinkLayer: LinkInfiniBand, RdAtomic: 16}
	cfg := DefaultConfig()
	cfg.Timeout, cfg.RetryCnt = 14, 3
	rtr, err := RTRAttr(l, remote, cfg)
	require.NoError(t, err)
	require.Equal(t, "RTR mask=STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN path_mtu=2048 dest_qpn=0x300 rq_psn=0x9 "+
		"max_dest_rd_atomic=16 min_rnr_timer=12 ah={dlid=0xc sl=0 port=2}", rtr.String())
	require.Equal(t, "RTS mask=STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN timeout=14 retry_cnt=3 rnr_retry=7 sq_psn=0x5 max_rd_atomic=16",
		RTSAttr(l, remote, cfg).String())

	// A peer in another IB subnet is reached by GID.
	remote.GID = mustGID(t, "fec0::2")
	rtr, err = RTRAttr(l, remote, cfg)
	require.NoError(t, err)
	require.True(t, rtr.AH.IsGlobal)
	require.Equal(t, remote.GID, rtr.AH.DGID)

	remote.GID, remote.LID = mustGID(t, "fe80::2"), 0
	_, err = RTRAttr(l, remote, cfg)
	require.ErrorContains(t, err, "no LID")
}

func TestRTRRejectsBadPeers(t *testing.T) {
	l, cfg := roceLocal(t), DefaultConfig()
	for _, tc := range []struct {
		edit func(*Endpoint)
		want string
	}{
		{func(e *Endpoint) { e.LinkLayer = LinkInfiniBand }, "link layers differ"},
		{func(e *Endpoint) { e.QPN = 0 }, "not a QP number"},
		{func(e *Endpoint) { e.QPN = 1 << 24 }, "not a QP number"},
		{func(e *Endpoint) { e.MTU = 0 }, "no valid path MTU"},
		{func(e *Endpoint) { e.GID = GID{} }, "no GID"},
	} {
		r := roceRemote(t)
		tc.edit(&r)
		_, err := RTRAttr(l, r, cfg)
		require.ErrorContains(t, err, tc.want)
	}
	// The peer's READ responder limits this side's outstanding READs; at
	// least one.
	r := roceRemote(t)
	r.RdAtomic = 0
	require.Equal(t, uint8(1), RTSAttr(l, r, cfg).MaxRdAtomic)
}

// Wrong orders are refused before the device sees them, and a failed
// modification leaves the state where it was.
func TestQPMachineOrder(t *testing.T) {
	r := &recorder{}
	m := qpMachine{modify: r.modify}
	err := m.connect(roceLocal(t), roceRemote(t), DefaultConfig())
	require.ErrorContains(t, err, "cannot connect a QP in RESET")
	err = m.apply(QPAttr{Mask: AttrState, State: QPRTS})
	require.ErrorContains(t, err, "cannot go from RESET to RTS (INIT first)")
	require.Empty(t, r.got)

	require.NoError(t, m.apply(InitAttr(1, AccessAll)))
	err = m.apply(RTSAttr(roceLocal(t), roceRemote(t), DefaultConfig()))
	require.ErrorContains(t, err, "cannot go from INIT to RTS (RTR first)")

	r.failAt = 3 // the third modification: INIT, RTR, then RTS fails
	err = m.connect(roceLocal(t), roceRemote(t), DefaultConfig())
	require.ErrorContains(t, err, "modify to RTS: Invalid argument")
	require.Equal(t, QPRTR, m.state)
	// Once in RTR, connecting again is refused: the QP is not new.
	require.ErrorContains(t, m.connect(roceLocal(t), roceRemote(t), DefaultConfig()), "in RTR")

	require.NoError(t, m.apply(StateAttr(QPErr)))
	require.ErrorContains(t, m.apply(InitAttr(1, AccessAll)), "only to RESET")
	require.Len(t, r.got, 4)
}

func TestCheckTransition(t *testing.T) {
	ok := map[[2]QPState]bool{
		{QPReset, QPInit}: true, {QPInit, QPInit}: true, {QPInit, QPRTR}: true, {QPRTR, QPRTS}: true, {QPRTS, QPRTS}: true,
	}
	for from := QPReset; from <= QPErr; from++ {
		for to := QPReset; to <= QPErr; to++ {
			err := CheckTransition(from, to)
			want := ok[[2]QPState{from, to}] || to == QPErr || to == QPReset
			require.Equal(t, want, err == nil, "%v -> %v: %v", from, to, err)
		}
	}
}

func TestAttrStrings(t *testing.T) {
	require.Equal(t, "STATE|0x2|AV", (AttrState | 1<<1 | AttrAV).String())
	require.Equal(t, "0", AttrMask(0).String())
	require.Equal(t, "SIGNALED|INLINE", (SendSignaled | SendInline).String())
	require.Equal(t, "RDMA_WRITE_WITH_IMM", OpWriteWithImm.String())
	require.Equal(t, "QPState(9)", QPState(9).String())
	require.Equal(t, 4096, MTU4096.Bytes())
	require.Equal(t, 0, MTU(7).Bytes())
	require.True(t, strings.HasPrefix(StateAttr(QPErr).String(), "ERR"))
	require.Equal(t, "remote access error", WCRemAccessErr.String())
	require.Equal(t, "Work Request Flushed Error", WCFlushErr.String())
	require.Equal(t, "unknown", WCStatus(99).String())
}
