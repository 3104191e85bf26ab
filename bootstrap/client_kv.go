package bootstrap

import (
	"context"
	"fmt"
	"strconv"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// The key-value store is shared by the whole job, in the manner of PyTorch's
// TCPStore. Keys are namespaced per group: a Client from Split sees its own
// keys, never its parent's or a sibling group's.

// storeKey is key in the client's namespace ("<group>:<key>"; group names
// contain no ':', so namespaces cannot collide).
func (c *Client) storeKey(key string) string { return c.group + string(kvGroupSep) + key }

// prepare checks the client and keys, and returns the call's context.
func (c *Client) prepare(ctx context.Context, what string, keys ...string) (context.Context, func(), int64, error) {
	if err := c.usable(what); err != nil {
		return nil, nil, 0, err
	}
	for _, k := range keys {
		if k == "" {
			return nil, nil, 0, fmt.Errorf("gccl bootstrap: %s: %w: empty key", c.describe(what), ErrInvalidArgument)
		}
	}
	rctx, done, timeoutMs := c.sess.blockingContext(ctx)
	return rctx, done, timeoutMs, nil
}

// Set stores value at key, waking the ranks waiting for it.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	what := "set " + strconv.Quote(key)
	rctx, done, _, err := c.prepare(ctx, what, key)
	if err != nil {
		return err
	}
	defer done()
	if _, err := c.sess.rpc.Set(rctx, &pb.SetRequest{Rank: c.sess.rank, Key: c.storeKey(key), Value: value}); err != nil {
		return c.sess.callError(ctx, c.describe(what), err)
	}
	return nil
}

// Get returns the value at key, waiting until some rank sets it (at most
// Config.Timeout, or ctx's deadline if earlier: then the error wraps
// ErrTimeout).
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	what := "get " + strconv.Quote(key)
	rctx, done, timeoutMs, err := c.prepare(ctx, what, key)
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := c.sess.rpc.Get(rctx, &pb.GetRequest{Rank: c.sess.rank, Key: c.storeKey(key), TimeoutMs: timeoutMs})
	if err != nil {
		return nil, c.sess.callError(ctx, c.describe(what), err)
	}
	if resp.Value == nil {
		return []byte{}, nil // the key exists: never answer nil
	}
	return resp.Value, nil
}

// Add adds delta to the decimal integer at key (a missing key counts as 0)
// and returns the new value. Values written by Add read back from Get as
// decimal text, as with TCPStore.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	what := "add " + strconv.Quote(key)
	rctx, done, _, err := c.prepare(ctx, what, key)
	if err != nil {
		return 0, err
	}
	defer done()
	resp, err := c.sess.rpc.Add(rctx, &pb.AddRequest{Rank: c.sess.rank, Key: c.storeKey(key), Delta: delta})
	if err != nil {
		return 0, c.sess.callError(ctx, c.describe(what), err)
	}
	return resp.Value, nil
}

// CompareAndSet stores desired at key if key holds old, or, when old is nil,
// if key does not exist (a non-nil empty old matches an existing empty
// value). It reports whether it stored desired.
func (c *Client) CompareAndSet(ctx context.Context, key string, old, desired []byte) (bool, error) {
	what := "compare-and-set " + strconv.Quote(key)
	rctx, done, _, err := c.prepare(ctx, what, key)
	if err != nil {
		return false, err
	}
	defer done()
	resp, err := c.sess.rpc.CompareAndSet(rctx, &pb.CompareAndSetRequest{
		Rank: c.sess.rank, Key: c.storeKey(key), ExpectAbsent: old == nil, Expected: old, Desired: desired,
	})
	if err != nil {
		return false, c.sess.callError(ctx, c.describe(what), err)
	}
	return resp.Swapped, nil
}

// Wait waits until every key exists (at most Config.Timeout, or ctx's
// deadline if earlier; the error names the missing keys).
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	what := fmt.Sprintf("wait for %d keys", len(keys))
	rctx, done, timeoutMs, err := c.prepare(ctx, what, keys...)
	if err != nil {
		return err
	}
	defer done()
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = c.storeKey(k)
	}
	if _, err := c.sess.rpc.Wait(rctx, &pb.WaitRequest{Rank: c.sess.rank, Keys: names, TimeoutMs: timeoutMs}); err != nil {
		return c.sess.callError(ctx, c.describe(what), err)
	}
	return nil
}

// Delete removes key and reports whether it existed.
func (c *Client) Delete(ctx context.Context, key string) (bool, error) {
	what := "delete " + strconv.Quote(key)
	rctx, done, _, err := c.prepare(ctx, what, key)
	if err != nil {
		return false, err
	}
	defer done()
	resp, err := c.sess.rpc.Delete(rctx, &pb.DeleteRequest{Rank: c.sess.rank, Key: c.storeKey(key)})
	if err != nil {
		return false, c.sess.callError(ctx, c.describe(what), err)
	}
	return resp.Existed, nil
}
