//go:build !unix

package netfd

import "net"

func dup(net.Conn) (int, error) { return -1, ErrNotSupported }
