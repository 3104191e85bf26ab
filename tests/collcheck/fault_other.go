//go:build !unix

package main

import "os"

// killSelf exits at once, skipping deferred work, as kill -9 would.
func killSelf() { os.Exit(137) }

// stopSelf blocks forever: the rank stops taking part, as a stopped
// process would.
func stopSelf() { select {} }
