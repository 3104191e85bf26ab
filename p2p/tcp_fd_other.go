//go:build !linux

package p2p

import "net"

// fdConn is Linux's connection outside the netpoller (tcp_fd_linux.go);
// elsewhere connections stay in it and these do nothing.
type fdConn struct{}

func detachConn(c net.Conn) net.Conn { return c }

func asFDConn(net.Conn) *fdConn { return nil }

func (*fdConn) pauseReader()  {}
func (*fdConn) resumeReader() {}
func (*fdConn) quiet()        {}
