package verbs

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Device is an RDMA device as sysfs (/sys/class/infiniband) describes it.
type Device struct {
	Name string // "mlx5_0", "rxe0"
	// BusID is the PCI function of the device ("0000:3b:00.0"); empty for
	// a software device (rxe, siw).
	BusID    string
	NUMA     int // the NUMA node of its PCI function; -1 when unknown
	NodeGUID string
	Ports    []PortInfo
}

// PortInfo is one port of a Device.
type PortInfo struct {
	Num       int
	State     PortState
	LinkLayer LinkLayer
	Rate      string // "100 Gb/sec (4X EDR)"
	LID       uint16
	// GIDs are the populated entries of the port's GID table.
	GIDs []GIDEntry
}

// Name is "device:port", as GCCL_IB_HCA and the logs write it.
func (p PortInfo) Name(dev string) string { return dev + ":" + strconv.Itoa(p.Num) }

// Devices lists the host's RDMA devices: their names from rdmamap, the rest
// from sysfs. With none, the error wraps ErrNotSupported.
func Devices() ([]Device, error) {
	devs, err := scanDevices("/", deviceNames("/"))
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%w: no RDMA devices (/sys/class/infiniband is empty or absent: no InfiniBand or RoCE NIC, or its driver is not loaded)", ErrNotSupported)
	}
	return devs, nil
}

// scanDevices reads the named devices under root (a sysfs tree's parent:
// "/" or a test's fake), in name order.
func scanDevices(root string, names []string) ([]Device, error) {
	names = append([]string(nil), names...)
	sort.Strings(names)
	var devs []Device
	for _, name := range names {
		dir := filepath.Join(root, "sys/class/infiniband", name)
		if _, err := os.Stat(dir); err != nil {
			continue // gone since it was listed
		}
		d := Device{Name: name, NUMA: -1, NodeGUID: readTrim(filepath.Join(dir, "node_guid"))}
		if link, err := filepath.EvalSymlinks(filepath.Join(dir, "device")); err == nil {
			if b := filepath.Base(link); pciFunction(b) {
				d.BusID = b
			}
			if n, err := strconv.Atoi(readTrim(filepath.Join(link, "numa_node"))); err == nil && n >= 0 {
				d.NUMA = n
			}
		}
		ports, err := os.ReadDir(filepath.Join(dir, "ports"))
		if err != nil {
			return nil, fmt.Errorf("verbs: %s: %w", name, err)
		}
		for _, pe := range ports {
			num, err := strconv.Atoi(pe.Name())
			if err != nil || num < 1 {
				continue
			}
			d.Ports = append(d.Ports, scanPort(filepath.Join(dir, "ports", pe.Name()), num))
		}
		sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Num < d.Ports[j].Num })
		devs = append(devs, d)
	}
	return devs, nil
}

func scanPort(dir string, num int) PortInfo {
	p := PortInfo{Num: num, LinkLayer: parseLinkLayer(readTrim(filepath.Join(dir, "link_layer"))),
		Rate: readTrim(filepath.Join(dir, "rate"))}
	// state: "4: ACTIVE"
	if s, _, ok := strings.Cut(readTrim(filepath.Join(dir, "state")), ":"); ok {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 && n < 256 {
			p.State = PortState(n)
		}
	}
	if lid, err := strconv.ParseUint(strings.TrimPrefix(readTrim(filepath.Join(dir, "lid")), "0x"), 16, 16); err == nil {
		p.LID = uint16(lid)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "gids"))
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil || idx < 0 {
			continue
		}
		g, err := ParseGID(readTrim(filepath.Join(dir, "gids", e.Name())))
		if err != nil || g.IsZero() {
			continue
		}
		// Reading the type of an unused entry fails (EINVAL); of a used
		// one it says "IB/RoCE v1" or "RoCE v2".
		p.GIDs = append(p.GIDs, GIDEntry{
			Index:  idx,
			GID:    g,
			Type:   parseGIDType(readTrim(filepath.Join(dir, "gid_attrs/types", e.Name()))),
			NetDev: readTrim(filepath.Join(dir, "gid_attrs/ndevs", e.Name())),
		})
	}
	sort.Slice(p.GIDs, func(i, j int) bool { return p.GIDs[i].Index < p.GIDs[j].Index })
	return p
}

// readTrim reads a small sysfs file, "" when it cannot. It uses the bare
// system calls: a port's GID table is 256 to 1024 files, and os.Open
// would also register each with Go's poller (sysfs files are pollable).
func readTrim(path string) string {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer syscall.Close(fd)
	var buf [256]byte
	n, err := syscall.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return ""
	}
	return strings.TrimSpace(string(buf[:n]))
}

// pciFunction reports whether s looks like a PCI function address
// ("0000:3b:00.0").
func pciFunction(s string) bool {
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(dom) < 4 {
		return false
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok || len(bus) != 2 {
		return false
	}
	dev, fn, ok := strings.Cut(rest, ".")
	return ok && len(dev) == 2 && len(fn) == 1
}

// dirNames lists a directory's entries; none when it is absent.
func dirNames(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
