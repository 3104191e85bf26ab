package comm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/gccl/gccl/topo"
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
	// CPUs is how many CPUs the rank may run on (runtime.NumCPU), and
	// CPUList which ones, in Linux cpulist form ("" where the platform does
	// not say), so that the ranks of a host agree on whether they
	// outnumber the CPUs they share (crowded).
	CPUs    int
	CPUList string
	// Transports is the rank's transport descriptor (transport.Prepared):
	// per transport, its address or why it is off.
	Transports []byte
	// Topo is the host's topology as NCCL XML, sent by the lowest rank of
	// each host only (the others would repeat it).
	Topo []byte
}

const peerInfoMagic = "gcclPI5"

// maxTopoXML bounds a descriptor's topology document (the largest published
// NCCL dumps are tens of KiB).
const maxTopoXML = 1 << 20

// maxCPUList bounds a descriptor's CPU list (every other CPU of 4096 is
// about 19 KiB).
const maxCPUList = 64 << 10

// maxTransportDesc bounds a descriptor's transport field.
const maxTransportDesc = 64 << 10

// marshal encodes the descriptor: a magic, then length-prefixed fields.
func (p *peerInfo) marshal() []byte {
	b := []byte(peerInfoMagic)
	for _, s := range []string{p.Version, p.HostID} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(p.Pid))
	b = binary.AppendUvarint(b, uint64(p.CPUs))
	b = binary.AppendUvarint(b, uint64(len(p.CPUList)))
	b = append(b, p.CPUList...)
	b = binary.AppendUvarint(b, uint64(len(p.Transports)))
	b = append(b, p.Transports...)
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
	fields := []*string{&p.Version, &p.HostID}
	for _, f := range fields {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) || n > 4096 {
			return p, fmt.Errorf("%w: truncated field", errBadPeerInfo)
		}
		*f = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	pid, k := binary.Uvarint(b)
	var n uint64
	if k <= 0 || pid > 1<<31 {
		return p, fmt.Errorf("%w: bad pid", errBadPeerInfo)
	}
	p.Pid = int(pid)
	b = b[k:]
	cpus, k := binary.Uvarint(b)
	if k <= 0 || cpus > 1<<20 {
		return p, fmt.Errorf("%w: bad CPU count", errBadPeerInfo)
	}
	p.CPUs = int(cpus)
	b = b[k:]
	n, k = binary.Uvarint(b)
	if k <= 0 || n > maxCPUList || n > uint64(len(b)-k) {
		return p, fmt.Errorf("%w: bad CPU list field", errBadPeerInfo)
	}
	p.CPUList = string(b[k : k+int(n)])
	if _, err := topo.ParseCPUList(p.CPUList); err != nil {
		return p, fmt.Errorf("%w: %w", errBadPeerInfo, err)
	}
	b = b[k+int(n):]
	n, k = binary.Uvarint(b)
	if k <= 0 || n > maxTransportDesc || n > uint64(len(b)-k) {
		return p, fmt.Errorf("%w: bad transport field", errBadPeerInfo)
	}
	if n > 0 {
		p.Transports = append([]byte(nil), b[k:k+int(n)]...)
	}
	b = b[k+int(n):]
	n, k = binary.Uvarint(b)
	if k <= 0 || n > maxTopoXML || n != uint64(len(b)-k) {
		return p, fmt.Errorf("%w: bad topology field or trailing bytes", errBadPeerInfo)
	}
	if n > 0 {
		p.Topo = append([]byte(nil), b[k:]...)
	}
	return p, nil
}

// checkVersions fails when a rank runs another gccl version than rank me.
func checkVersions(me int, infos []peerInfo) error {
	for p, info := range infos {
		if info.Version != infos[me].Version {
			return fmt.Errorf("%w: rank %d runs gccl %s, rank %d runs %s", ErrMismatch, p, info.Version, me, infos[me].Version)
		}
	}
	return nil
}
