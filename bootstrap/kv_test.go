package bootstrap

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestKVSetGet(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	ctx := context.Background()

	if err := c[0].Set(ctx, "addr", []byte("10.0.0.1:1234")); err != nil {
		t.Fatal(err)
	}
	got, err := c[1].Get(ctx, "addr")
	if err != nil || string(got) != "10.0.0.1:1234" {
		t.Fatalf("Get = %q, %v; want the value rank 0 set", got, err)
	}
	// An empty value is a value: Get answers it at once, and non-nil.
	if err := c[0].Set(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := c[1].Get(ctx, "empty"); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("Get(empty) = %#v, %v; want []byte{}", got, err)
	}
	// Set overwrites.
	if err := c[1].Set(ctx, "addr", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if got, _ := c[0].Get(ctx, "addr"); string(got) != "new" {
		t.Fatalf("Get after overwrite = %q", got)
	}
	if err := c[0].Set(ctx, "", []byte("x")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Set with an empty key: %v, want ErrInvalidArgument", err)
	}
}

func TestKVGetBlocksUntilSet(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	ctx := context.Background()

	got := make(chan string, 1)
	go func() {
		v, err := c[1].Get(ctx, "late")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(v)
	}()
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before the key was set", v)
	case <-time.After(100 * time.Millisecond):
	}
	if err := c[0].Set(ctx, "late", []byte("here")); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v != "here" {
			t.Fatalf("blocked Get = %q, want %q", v, "here")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Get did not wake up after Set")
	}
}

func TestKVGetTimeout(t *testing.T) {
	srv, secret := startServer(t, 1)
	c := joinAll(t, srv, secret, 1, func(cfg *Config) { cfg.Timeout = 200 * time.Millisecond })
	start := time.Now()
	_, err := c[0].Get(context.Background(), "never")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get of a key nobody sets: %v, want ErrTimeout", err)
	}
	if !strings.Contains(err.Error(), `never`) || !strings.Contains(err.Error(), "rank 0") {
		t.Errorf("timeout message should name the rank and the key: %v", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("Get with a 200ms timeout took %v", waited)
	}

	// A context deadline shorter than Config.Timeout also ends in ErrTimeout,
	// and the context's own error stays visible.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c[0].Get(ctx, "never"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get with an expiring context: %v, want ErrTimeout", err)
	}

	// Cancelling the context ends a blocked Get with context.Canceled.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := c[0].Get(ctx, "never"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestKVAdd(t *testing.T) {
	const ranks, adds = 4, 25
	srv, secret := startServer(t, ranks)
	c := joinAll(t, srv, secret, ranks, nil)
	ctx := context.Background()

	if v, err := c[0].Add(ctx, "n", 5); err != nil || v != 5 {
		t.Fatalf("Add to a missing key = %d, %v; want 5", v, err)
	}
	if v, err := c[1].Add(ctx, "n", -7); err != nil || v != -2 {
		t.Fatalf("Add(-7) = %d, %v; want -2", v, err)
	}
	// Concurrent adds are atomic.
	noErrors(t, onEveryRank(c, func(_ int, cl *Client) error {
		for range adds {
			if _, err := cl.Add(ctx, "counter", 1); err != nil {
				return err
			}
		}
		return nil
	}))
	if got, err := c[2].Get(ctx, "counter"); err != nil || string(got) != "100" {
		t.Fatalf("counter = %q, %v; want 100 (decimal text)", got, err)
	}
	if err := c[0].Set(ctx, "text", []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := c[0].Add(ctx, "text", 1); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "abc") {
		t.Fatalf("Add on a non-number: %v, want ErrInvalidArgument naming the value", err)
	}
}

func TestKVCompareAndSet(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	ctx := context.Background()

	cases := []struct {
		name         string
		old, desired string
		nilOld       bool
		wantSwapped  bool
		wantAfter    string
	}{
		{name: "absent as expected", nilOld: true, desired: "a", wantSwapped: true, wantAfter: "a"},
		{name: "absent expected but present", nilOld: true, desired: "b", wantSwapped: false, wantAfter: "a"},
		{name: "wrong old value", old: "x", desired: "b", wantSwapped: false, wantAfter: "a"},
		{name: "matching old value", old: "a", desired: "b", wantSwapped: true, wantAfter: "b"},
		{name: "empty old does not match absent-or-other", old: "", desired: "c", wantSwapped: false, wantAfter: "b"},
	}
	for _, tc := range cases {
		var old []byte
		if !tc.nilOld {
			old = []byte(tc.old)
		}
		swapped, err := c[0].CompareAndSet(ctx, "k", old, []byte(tc.desired))
		if err != nil || swapped != tc.wantSwapped {
			t.Fatalf("%s: swapped = %v, %v; want %v", tc.name, swapped, err, tc.wantSwapped)
		}
		if got, _ := c[1].Get(ctx, "k"); string(got) != tc.wantAfter {
			t.Fatalf("%s: value = %q, want %q", tc.name, got, tc.wantAfter)
		}
	}

	// Exactly one of several racing ranks wins the first CompareAndSet.
	var mu sync.Mutex
	winners := 0
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		ok, err := cl.CompareAndSet(ctx, "leader", nil, []byte{byte(r)})
		mu.Lock()
		defer mu.Unlock()
		if ok {
			winners++
		}
		return err
	}))
	if winners != 1 {
		t.Fatalf("%d ranks won the election, want 1", winners)
	}
}

func TestKVWaitAndDelete(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, func(cfg *Config) { cfg.Timeout = 5 * time.Second })
	ctx := context.Background()

	done := make(chan error, 1)
	go func() { done <- c[1].Wait(ctx, "a", "b", "c") }()
	for _, k := range []string{"a", "b"} {
		if err := c[0].Set(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) with key c still missing", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := c[0].Set(ctx, "c", nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait after every key was set: %v", err)
	}
	if err := c[1].Wait(ctx); err != nil {
		t.Fatalf("Wait for no keys: %v", err)
	}

	if existed, err := c[0].Delete(ctx, "a"); err != nil || !existed {
		t.Fatalf("Delete(a) = %v, %v; want true", existed, err)
	}
	if existed, err := c[0].Delete(ctx, "a"); err != nil || existed {
		t.Fatalf("second Delete(a) = %v, %v; want false", existed, err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := c[1].Wait(short, "a", "b")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait for a deleted key: %v, want ErrTimeout", err)
	}
}

func TestKVTimeoutNamesMissingKeys(t *testing.T) {
	srv, secret := startServer(t, 1)
	c := joinAll(t, srv, secret, 1, func(cfg *Config) { cfg.Timeout = 150 * time.Millisecond })
	ctx := context.Background()
	if err := c[0].Set(ctx, "present", nil); err != nil {
		t.Fatal(err)
	}
	err := c[0].Wait(ctx, "present", "missing-1", "missing-2")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait: %v, want ErrTimeout", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "missing-1") || !strings.Contains(msg, "missing-2") || strings.Contains(msg, `"w:present"`) {
		t.Fatalf("the message should name exactly the missing keys: %v", err)
	}
}
