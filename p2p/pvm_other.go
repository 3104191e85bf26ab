//go:build !linux

package p2p

func probePVM(pid int, addr uint64, token []byte) error { return ErrNotSupported }

func pvmCopy(pid int, write bool, local [][]byte, remote []uint64) error { return ErrNotSupported }
