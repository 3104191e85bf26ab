package p2p

import (
	"errors"
	"testing"
)

// TestMetadataReload: a newer blob of a peer replaces the loaded one (lists
// prepared against the old one must be prepared again), an older one is
// ignored, and Invalidate forgets the peer.
func TestMetadataReload(t *testing.T) {
	a := newAgent(t, "a", Config{DisableSHM: true, DisablePVM: true})
	b := newAgent(t, "b", Config{})
	r1, _ := b.RegisterMem(make([]byte, 4096))
	old := b.LocalMetadata()
	if _, err := a.LoadRemote(ctxT(t), old); err != nil {
		t.Fatal(err)
	}
	req := request4K(t, a, Write, "b", r1.Desc(0, 4096))
	r2, _ := b.RegisterMem(make([]byte, 8192))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	if rs, _ := a.RemoteRegions("b"); len(rs) != 2 || rs[1].ID != r2.ID() || rs[1].Len != 8192 {
		t.Fatalf("regions after reload: %+v", rs)
	}
	if _, err := req.Post(); !errors.Is(err, ErrRemoteDisconnect) {
		t.Fatalf("Post of a list prepared against replaced metadata: %v", err)
	}
	req.Release()
	if _, err := a.LoadRemote(ctxT(t), old); err != nil {
		t.Fatal(err)
	}
	if rs, _ := a.RemoteRegions("b"); len(rs) != 2 {
		t.Fatalf("an older blob replaced a newer one: %+v", rs)
	}
	if err := a.Invalidate("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PrepareRemote("b", DescList{Type: DRAM, Descs: []Desc{r1.Desc(0, 1)}}); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("prepare against an invalidated peer: %v", err)
	}
	if err := a.Invalidate("b"); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("second Invalidate: %v", err)
	}
	if _, err := a.LoadRemote(ctxT(t), a.LocalMetadata()); err == nil {
		t.Fatal("an agent loaded its own metadata")
	}
	if _, err := a.LoadRemote(ctxT(t), []byte("junk")); !errors.Is(err, ErrBadMetadata) {
		t.Fatalf("junk metadata: %v", err)
	}
}

// TestStaleBlobKeepsRegionDropped: a blob of the peer that is newer than
// the loaded one but older than a deregistration the peer announced must
// not bring the deregistered region back (pvm would write into memory the
// peer let go).
func TestStaleBlobKeepsRegionDropped(t *testing.T) {
	cfg := Config{DisableSHM: true, DisablePVM: true}
	a := newAgent(t, "a", cfg)
	b := newAgent(t, "b", cfg)
	b.RegisterMem(make([]byte, 4096))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { b.mu.RLock(); defer b.mu.RUnlock(); return len(b.conns) > 0 }) // b's end of the connection is up
	r1, _ := b.RegisterMem(make([]byte, 4096))
	stale := b.LocalMetadata() // published, say, to a store
	if err := b.DeregisterMem(r1); err != nil {
		t.Fatal(err)
	}
	ra, _ := a.remote("b")
	waitFor(t, func() bool { _, ok := ra.droppedAny([]uint32{r1.ID()}); return ok })
	if _, err := a.LoadRemote(ctxT(t), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PrepareRemote("b", DescList{Type: DRAM, Descs: []Desc{r1.Desc(0, 4096)}}); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("prepare against a region the peer deregistered: %v", err)
	}
}

// TestReloadTakesMappingsFromUnusedOld: while a newer blob is loaded, the
// old remote's mappings move to the new one (or are unmapped, for segments
// the new blob lacks). From that moment the old remote must refuse new
// transfers: one that started on it would copy into memory that is unmapped
// or no longer its own.
func TestReloadTakesMappingsFromUnusedOld(t *testing.T) {
	skipWithout(t, BackendSHM)
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	r1, _ := b.Alloc(1 << 20)
	b.Alloc(1 << 20)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	lr, _ := a.RegisterMem(make([]byte, 4096))
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, "b", DescList{Type: DRAM, Descs: []Desc{r1.Desc(0, 4096)}}, nil)
	if err != nil || req.Backend() != BackendSHM {
		t.Fatalf("%v %v", req, err)
	}
	defer req.Release()
	old, _ := a.remote("b")
	// A newer blob without r1, as loadInfo builds it before the swap.
	info := *old.info
	info.Gen++
	info.Regions = nil
	for _, r := range old.info.Regions {
		if r.ID != r1.ID() {
			info.Regions = append(info.Regions, r)
		}
	}
	ra := newRemoteAgent(a, &info, old)
	defer ra.invalidate()
	// A Post on the old remote in this window.
	if _, err := req.Post(); !errors.Is(err, ErrRemoteDisconnect) {
		t.Fatalf("Post on a remote whose mappings were taken: %v", err)
	}
}
