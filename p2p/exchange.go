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
