package ibverbs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/tcp"
)

// Store keys: what rank a publishes for its pair with rank b, in the job's
// store (namespaced per communicator by the store itself).
func infoKey(job string, a, b int) string  { return fmt.Sprintf("gccl-ib/%s/qp/%d-%d", job, a, b) }
func readyKey(job string, a, b int) string { return fmt.Sprintf("gccl-ib/%s/ready/%d-%d", job, a, b) }
func tcpKey(job string, a int) string      { return fmt.Sprintf("gccl-ib/%s/tcp/%d", job, a) }

// Connect connects to each peer over qps RC QPs (the smaller of the two
// ranks' GCCL_IB_QPS_PER_CONNECTION), exchanging QP numbers and memory
// keys once per pair through the job's store:
//
//  1. for each peer, register the connection's memory, create its QPs and
//     post their receives, and publish that (or why it failed);
//  2. read each peer's, move the QPs to RTR and RTS, and publish whether
//     that worked;
//  3. read each peer's verdict: a pair that failed on either side (a QP
//     that did not reach RTR, a registration the kernel refused) is
//     carried by TCP instead, with a WARN naming the pair and the reason,
//     or, under GCCL_STRICT=1, fails Connect.
//
// Every rank sets all its keys of a step before it reads any, so the order
// in which ranks connect does not matter.
func (l *listener) Connect(ctx context.Context, bell transport.Bell, peers []*transport.Descriptor) (transport.Endpoint, error) {
	s := &l.s
	if s.Store == nil {
		return nil, errors.New("ibverbs: no key-value store to exchange queue pairs through")
	}
	l.connected = true
	e := &Endpoint{rank: s.Rank, size: s.Size, slotSize: s.SlotSize, bell: bell, log: l.log,
		name: "NET/IB/" + l.addr.Name(), ctx: l.ctx, pd: l.pd, port: l.port,
		conns: make([]*conn, s.Size), wcs: make([]verbs.WC, 64)}
	fail := func(err error) (transport.Endpoint, error) {
		e.release()
		return nil, err
	}
	peers = append([]*transport.Descriptor(nil), peers...)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Rank < peers[j].Rank })

	geos := make([]geometry, len(peers))
	addrs := make([]portAddr, len(peers))
	depth := 16
	for i, d := range peers {
		a, err := parseAddr(d.Addr(Name))
		if err != nil {
			return fail(fmt.Errorf("ibverbs: rank %d: %w", d.Rank, err))
		}
		addrs[i] = a
		if geos[i], err = newGeometry(s.SlotSize, s.SlotCount, min(l.o.qps, a.QPs)); err != nil {
			return fail(err)
		}
		depth += geos[i].cqDepth()
	}
	var err error
	if e.cq, err = l.ctx.CreateCQ(depth, true); err != nil {
		return fail(err)
	}

	// 1. This side of every pair.
	why := make([]string, len(peers))
	for i, d := range peers {
		c, err := e.newConn(d.Rank, geos[i])
		info := pairInfo{}
		if err != nil {
			why[i] = fmt.Sprintf("rank %d could not set up its side: %v", s.Rank, err)
			info.Failed = why[i]
		} else {
			e.conns[d.Rank] = c
			e.list = append(e.list, c)
			info = c.info()
		}
		if err := s.Store.Set(ctx, infoKey(s.JobID, s.Rank, d.Rank), info.marshal()); err != nil {
			return fail(fmt.Errorf("ibverbs: publishing the QPs for rank %d: %w", d.Rank, err))
		}
	}
	// 2. Connect to the peers' QPs.
	for i, d := range peers {
		b, err := s.Store.Get(ctx, infoKey(s.JobID, d.Rank, s.Rank))
		if err != nil {
			return fail(fmt.Errorf("ibverbs: reading rank %d's QPs: %w", d.Rank, err))
		}
		p, err := parsePairInfo(b)
		switch {
		case err != nil:
			why[i] = err.Error()
		case p.Failed != "" && why[i] == "":
			why[i] = p.Failed
		case why[i] == "":
			if err := e.conns[d.Rank].connect(p, l.o.verbs); err != nil {
				why[i] = err.Error()
			}
		}
		if err := s.Store.Set(ctx, readyKey(s.JobID, s.Rank, d.Rank), []byte(why[i])); err != nil {
			return fail(fmt.Errorf("ibverbs: publishing the state of the QPs for rank %d: %w", d.Rank, err))
		}
	}
	// 3. Agree, pair by pair.
	var failed []int
	var lines []string
	for i, d := range peers {
		b, err := s.Store.Get(ctx, readyKey(s.JobID, d.Rank, s.Rank))
		if err != nil {
			return fail(fmt.Errorf("ibverbs: reading the state of rank %d's QPs: %w", d.Rank, err))
		}
		if why[i] == "" && len(b) > 0 {
			why[i] = fmt.Sprintf("on rank %d: %s", d.Rank, b)
		}
		if why[i] != "" {
			failed = append(failed, d.Rank)
			lines = append(lines, fmt.Sprintf("rank %d -> %d via TCP instead of IB (%s)", s.Rank, d.Rank, why[i]))
			continue
		}
		a := addrs[i]
		qps := "1 QP"
		if geos[i].qps > 1 {
			qps = fmt.Sprintf("%d QPs", geos[i].qps)
		}
		e.log.Info(fmt.Sprintf("rank %d -> %d via %s (%s, GID %d %s; peer %s GID %v; %s, MTU %v)",
			s.Rank, d.Rank, e.name, l.addr.Fabric(), l.addr.GIDIndex, l.addr.GID, a.Name(), a.GID, qps,
			min(l.addr.MTU.Bytes(), a.MTU.Bytes())), "subsys", "INIT")
	}
	if len(peers) > len(failed) {
		e.log.Info("NET/IB : RDMA carries host memory only: device buffers cross hosts through registered host staging (GPUDirect RDMA is not used yet)", "subsys", "NET")
	}
	if len(failed) > 0 {
		if l.o.strict {
			return fail(fmt.Errorf("%w: GCCL_STRICT=1 forbids a downgrade: %s", verbs.ErrNotSupported, strings.Join(lines, "; ")))
		}
		for _, line := range lines {
			e.log.Warn(line, "subsys", "INIT")
		}
		for _, p := range failed {
			if c := e.conns[p]; c != nil {
				c.release()
				e.conns[p] = nil
				for k, x := range e.list {
					if x == c {
						e.list = append(e.list[:k], e.list[k+1:]...)
						break
					}
				}
			}
		}
		if e.fallback, err = l.connectTCP(ctx, bell, failed); err != nil {
			return fail(err)
		}
		e.viaTCP = make([]bool, s.Size)
		for _, p := range failed {
			e.viaTCP[p] = true
		}
	}
	e.dirty = make([]*conn, 0, len(e.list))
	e.armc, e.waiterDone = make(chan struct{}, 1), make(chan struct{})
	go e.waiter()
	return e, nil
}

// connectTCP connects the pairs whose RDMA failed over TCP, the way the
// TCP transport would have (its address through the store).
func (l *listener) connectTCP(ctx context.Context, bell transport.Bell, peers []int) (*tcp.Endpoint, error) {
	s := &l.s
	token := sha256.Sum256([]byte("gccl-ib-fallback:" + s.JobID))
	ln, err := tcp.Listen(s.Rank, s.Size, tcp.Config{SlotSize: s.SlotSize, SlotCount: s.SlotCount, Token: token[:], Bell: bell})
	if err != nil {
		return nil, fmt.Errorf("ibverbs: TCP for the pairs RDMA could not connect: %w", err)
	}
	defer ln.Close()
	if err := s.Store.Set(ctx, tcpKey(s.JobID, s.Rank), []byte(ln.Addr())); err != nil {
		return nil, err
	}
	addrs := make([]string, s.Size)
	for _, p := range peers {
		b, err := s.Store.Get(ctx, tcpKey(s.JobID, p))
		if err != nil {
			return nil, fmt.Errorf("ibverbs: reading rank %d's TCP address: %w", p, err)
		}
		addrs[p] = string(b)
	}
	return ln.Connect(ctx, peers, addrs)
}
