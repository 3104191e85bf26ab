//go:build !unix

package main

import (
	"errors"
	"net"
)

func nonblocking([]net.Conn) ([]int, error) {
	return nil, errors.New("-poll needs a Unix system")
}

func pollParts([]int, []byte) error { return errors.New("-poll needs a Unix system") }
