package comm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Version is the gccl library version every rank of a job must share.
const Version = "0.1.0-dev"

// HostID identifies the host a process runs on, as far as its transports
// are concerned: processes with the same HostID can share memory through
// /dev/shm. It covers the boot, the hostname and the network namespace, so
// that namespaces joined by veth pairs count as different hosts (as they
// would be in production). GCCL_HOSTID overrides it.
func HostID() string {
	if id := os.Getenv("GCCL_HOSTID"); id != "" {
		return id
	}
	host, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	netns, _ := os.Readlink("/proc/self/ns/net")
	sum := sha256.Sum256([]byte(host + "\x00" + strings.TrimSpace(string(boot)) + "\x00" + netns))
	return host + "-" + hex.EncodeToString(sum[:6])
}

// peerInfo is the descriptor each rank publishes at Init.
type peerInfo struct {
	Version string
	HostID  string
	Pid     int
	Shm     string // shared-memory mailbox name, empty if none
	TCP     string // TCP listen address, empty if none
	// Topo is the host's topology as NCCL XML, sent by the lowest rank of
	// each host only (the others would repeat it).
	Topo []byte
}

const peerInfoMagic = "gcclPI2"

// maxTopoXML bounds a descriptor's topology document (the largest published
// NCCL dumps are tens of KiB).
const maxTopoXML = 1 << 20

// marshal encodes the descriptor: a magic, then length-prefixed fields.
func (p *peerInfo) marshal() []byte {
	b := []byte(peerInfoMagic)
	for _, s := range []string{p.Version, p.HostID, p.Shm, p.TCP} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(p.Pid))
	b = binary.AppendUvarint(b, uint64(len(p.Topo)))
	return append(b, p.Topo...)
}

var errBadPeerInfo = errors.New("malformed peer descriptor")

// unmarshalPeerInfo parses a descriptor from another rank defensively.
func unmarshalPeerInfo(b []byte) (peerInfo, error) {
	var p peerInfo
	if len(b) < len(peerInfoMagic) || string(b[:len(peerInfoMagic)]) != peerInfoMagic {
		return p, fmt.Errorf("%w: bad magic (is every rank running gccl %s?)", errBadPeerInfo, Version)
	}
	b = b[len(peerInfoMagic):]
	fields := []*string{&p.Version, &p.HostID, &p.Shm, &p.TCP}
	for _, f := range fields {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) || n > 4096 {
			return p, fmt.Errorf("%w: truncated field", errBadPeerInfo)
		}
		*f = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	pid, k := binary.Uvarint(b)
	if k <= 0 || pid > 1<<31 {
		return p, fmt.Errorf("%w: bad pid", errBadPeerInfo)
	}
	p.Pid = int(pid)
	b = b[k:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxTopoXML || n != uint64(len(b)-k) {
		return p, fmt.Errorf("%w: bad topology field or trailing bytes", errBadPeerInfo)
	}
	if n > 0 {
		p.Topo = append([]byte(nil), b[k:]...)
	}
	return p, nil
}

// route is the transport chosen for one peer.
type route uint8

const (
	routeNone route = iota
	routeSHM
	routeTCP
)

func (r route) String() string {
	switch r {
	case routeSHM:
		return "SHM"
	case routeTCP:
		return "TCP"
	}
	return "NONE"
}

// routeChoice is the outcome of chooseRoutes: a route per peer, and the log
// lines that explain it.
type routeChoice struct {
	routes    []route
	infos     []string // INFO: "rank 0 -> 1 via SHM"
	downgrade []string // WARN: a faster path was expected but not used
}

// chooseRoutes picks, per peer, the fastest transport both sides can use:
// shared memory on the same host, TCP otherwise. shmDisabled forces the
// network (GCCL_SHM_DISABLE=1), which is a downgrade for same-host peers;
// strict (GCCL_STRICT=1) makes any downgrade an error.
func chooseRoutes(me int, infos []peerInfo, shmDisabled, strict bool) (routeChoice, error) {
	rc := routeChoice{routes: make([]route, len(infos))}
	mine := infos[me]
	for p, info := range infos {
		if p == me {
			continue
		}
		if info.Version != mine.Version {
			return rc, fmt.Errorf("%w: rank %d runs gccl %s, rank %d runs %s", ErrMismatch, p, info.Version, me, mine.Version)
		}
		sameHost := info.HostID == mine.HostID
		switch {
		case sameHost && !shmDisabled && info.Shm != "" && mine.Shm != "":
			rc.routes[p] = routeSHM
		case info.TCP != "" && mine.TCP != "":
			rc.routes[p] = routeTCP
			if sameHost {
				why := "GCCL_SHM_DISABLE=1"
				if !shmDisabled {
					why = "shared memory unavailable"
				}
				rc.downgrade = append(rc.downgrade, fmt.Sprintf("rank %d -> %d via TCP instead of SHM (%s)", me, p, why))
			}
		default:
			return rc, fmt.Errorf("%w: no transport reaches rank %d (host %s) from rank %d (host %s)", ErrNotSupported, p, info.HostID, me, mine.HostID)
		}
		rc.infos = append(rc.infos, fmt.Sprintf("rank %d -> %d via %s", me, p, rc.routes[p]))
	}
	if strict && len(rc.downgrade) > 0 {
		return rc, fmt.Errorf("%w: GCCL_STRICT=1 forbids a downgrade: %s", ErrNotSupported, strings.Join(rc.downgrade, "; "))
	}
	return rc, nil
}
