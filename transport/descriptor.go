package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Descriptor is what one rank published for the transports: per transport,
// the address peers connect to, or why the transport is off there.
type Descriptor struct {
	Rank int
	Host string // the rank's host identity (processes on one host share memory)
	Pid  int
	// entries by transport name, in the rank's priority order.
	entries []entry
}

type entry struct {
	name string
	addr []byte // nil when off
	off  string // why the transport is off on the rank
}

// Addr is the address the rank published for the transport, nil if none.
func (d *Descriptor) Addr(transport string) []byte {
	if e := d.find(transport); e != nil {
		return e.addr
	}
	return nil
}

// Off is why the transport is off on the rank, "" if it is on or the rank
// did not mention it.
func (d *Descriptor) Off(transport string) string {
	if e := d.find(transport); e != nil {
		return e.off
	}
	return ""
}

func (d *Descriptor) find(name string) *entry {
	for i := range d.entries {
		if d.entries[i].name == name {
			return &d.entries[i]
		}
	}
	return nil
}

func (d *Descriptor) set(name string, addr []byte, off string) {
	d.entries = append(d.entries, entry{name: name, addr: addr, off: off})
}

// NewDescriptor makes a descriptor from its parts, for transports' tests:
// addrs and offs by transport name.
func NewDescriptor(rank int, host string, pid int, addrs map[string][]byte, offs map[string]string) *Descriptor {
	d := &Descriptor{Rank: rank, Host: host, Pid: pid}
	for n, a := range addrs {
		d.set(n, a, "")
	}
	for n, o := range offs {
		d.set(n, nil, o)
	}
	return d
}

// Limits of a descriptor from another rank, parsed defensively.
const (
	descMagic     = "gcclTD1"
	maxEntries    = 16
	maxNameLen    = 32
	maxEntryBytes = 4096
)

var errBadDescriptor = errors.New("malformed transport descriptor")

// marshalEntries encodes the entries: a magic, a count, then per entry its
// name, a flag (0 address, 1 off) and the address or the reason,
// length-prefixed.
func (d *Descriptor) marshalEntries() []byte {
	b := []byte(descMagic)
	b = binary.AppendUvarint(b, uint64(len(d.entries)))
	for _, e := range d.entries {
		b = binary.AppendUvarint(b, uint64(len(e.name)))
		b = append(b, e.name...)
		v := e.addr
		if e.addr == nil {
			b = append(b, 1)
			v = []byte(truncate(e.off, maxEntryBytes))
		} else {
			b = append(b, 0)
		}
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b
}

func (d *Descriptor) unmarshalEntries(b []byte) error {
	if len(b) < len(descMagic) || string(b[:len(descMagic)]) != descMagic {
		return fmt.Errorf("%w: bad magic (is every rank running the same gccl?)", errBadDescriptor)
	}
	b = b[len(descMagic):]
	take := func(limit int) ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(limit) || n > uint64(len(b)-k) {
			return nil, false
		}
		v := b[k : k+int(n)]
		b = b[k+int(n):]
		return v, true
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxEntries {
		return fmt.Errorf("%w: bad entry count", errBadDescriptor)
	}
	b = b[k:]
	d.entries = nil
	for range n {
		name, ok := take(maxNameLen)
		if !ok || len(b) < 1 {
			return fmt.Errorf("%w: truncated entry", errBadDescriptor)
		}
		flag := b[0]
		b = b[1:]
		v, ok := take(maxEntryBytes)
		if !ok || flag > 1 || d.find(string(name)) != nil {
			return fmt.Errorf("%w: bad entry %q", errBadDescriptor, name)
		}
		if flag == 0 {
			d.set(string(name), append([]byte{}, v...), "")
		} else {
			d.set(string(name), nil, string(v))
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errBadDescriptor, len(b))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// MarshalEntries encodes d's entries as Prepared.Descriptor does.
func MarshalEntries(d *Descriptor) []byte { return d.marshalEntries() }

// ParseDescriptor decodes the entries a rank published, defensively.
func ParseDescriptor(rank int, host string, pid int, entries []byte) (*Descriptor, error) {
	d := &Descriptor{Rank: rank, Host: host, Pid: pid}
	if err := d.unmarshalEntries(entries); err != nil {
		return nil, err
	}
	return d, nil
}

// ReachBoth is the Reach of a transport that connects any two ranks that
// both published an address for it (name): OK when both did, else why not,
// from the rank's own descriptor or the peer's.
func ReachBoth(name string, me, peer *Descriptor) Reach {
	r := Reach{Expected: true}
	switch {
	case me.Addr(name) != nil && peer.Addr(name) != nil:
		r.OK = true
	case me.Addr(name) == nil && me.Off(name) != "":
		r.Why = me.Off(name)
	case peer.Addr(name) == nil && peer.Off(name) != "":
		r.Why = fmt.Sprintf("on rank %d: %s", peer.Rank, peer.Off(name))
	default:
		r.Why = "not listening"
	}
	return r
}
