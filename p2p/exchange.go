package p2p

import (
	"context"
	"fmt"
)

// KV is the part of a key-value store that metadata exchange needs; the
// gccl bootstrap client (*bootstrap.Client) is one, so a job that already
// has a rendezvous needs no etcd.
type KV interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// metadataKey is where an agent's metadata lives in the store.
func metadataKey(name string) string { return "p2p/md/" + name }

// PublishMetadata stores this agent's metadata in kv, for FetchRemote.
// Publish again after registering more regions that peers must reach.
func (a *Agent) PublishMetadata(ctx context.Context, kv KV) error {
	if err := kv.Set(ctx, metadataKey(a.name), a.LocalMetadata()); err != nil {
		return fmt.Errorf("p2p: publishing metadata of %s: %w", a.name, err)
	}
	return nil
}

// FetchRemote waits for peer's metadata in kv (as long as the store's Get
// waits) and loads it.
func (a *Agent) FetchRemote(ctx context.Context, kv KV, peer string) error {
	blob, err := kv.Get(ctx, metadataKey(peer))
	if err != nil {
		return fmt.Errorf("p2p: fetching metadata of %s: %w", peer, err)
	}
	_, err = a.LoadRemote(ctx, blob)
	return err
}

// RemoteRegion is a region a peer registered, as its metadata describes it.
type RemoteRegion struct {
	ID     uint32
	Type   MemType
	Addr   uint64 // first address (DRAM, VRAM: a device address) or file offset (FILE)
	Len    uint64
	Shared bool   // in shared memory (Alloc)
	Device uint32 // VRAM: the CUDA device ordinal in the peer's process
	Bus    string // VRAM: that device's PCI bus id
}

// Desc describes n bytes of the region starting off bytes into it.
func (r RemoteRegion) Desc(off, n uint64) Desc {
	d := Desc{Addr: r.Addr + off, Len: n}
	switch r.Type {
	case FILE:
		d.DevID = r.ID
	case VRAM:
		d.DevID = r.Device
	}
	return d
}

// RemoteRegions lists the regions of a loaded peer, by ID.
func (a *Agent) RemoteRegions(peer string) ([]RemoteRegion, error) {
	ra, err := a.remote(peer)
	if err != nil {
		return nil, err
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	var out []RemoteRegion
	for _, r := range ra.table.all() {
		out = append(out, RemoteRegion{ID: r.ID, Type: r.Type, Addr: r.Base, Len: r.Len, Shared: r.Flags&regionSHM != 0, Device: r.Dev, Bus: r.Bus})
	}
	return out, nil
}
