package main

import (
	"testing"
	"time"
)

// TestHugeSizesEnd: sizes near the top of int must neither overflow into
// an endless sweep nor wrap in parseSize.
func TestHugeSizesEnd(t *testing.T) {
	if _, err := parseSize("9000000000G"); err == nil {
		t.Error("parseSize accepted a size that overflows")
	}
	o, err := parseFlags([]string{"-b", "4K", "-e", "4611686018427387904", "-f", "4", "-max", "1M"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { done <- len(o.points()) }()
	select {
	case n := <-done:
		if n != 5 { // 4K, 16K, 64K, 256K, 1M
			t.Fatalf("%d points", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("points() does not end when the block size overflows")
	}
}
