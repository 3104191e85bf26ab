//go:build !linux

package p2p

func bootID() string { return "" }

func processGone(pid int) bool { return false }
