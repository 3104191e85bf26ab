//go:build !linux

package tcp

import (
	"net"
	"syscall"
	"time"
)

// The TCP transport drives its sockets with epoll (see rawio_linux.go);
// elsewhere Listen reports that it is not supported. Interface selection
// works everywhere.

const supported = false

const (
	wantRead  = 1
	wantWrite = 2
)

func detachFD(*net.TCPConn) (int, error)                    { return -1, errUnsupportedOS }
func closeFD(int)                                           {}
func readFD(int, []byte) (int, error)                       { return 0, errUnsupportedOS }
func writeFD(int, []byte, []byte) (int, error)              { return 0, errUnsupportedOS }
func shutdownFD(int)                                        {}
func lingerFDs([]int, time.Time)                            {}
func setSocketBuffers(_, _ string, _ syscall.RawConn) error { return nil }

type poller struct{}

type pollEvent struct {
	peer, stream       int
	readable, writable bool
	hangup, wake       bool
}

func newPoller() (*poller, error)                           { return nil, errUnsupportedOS }
func (*poller) add(fd, peer, stream int) error              { return errUnsupportedOS }
func (*poller) arm(fd, peer, stream int, want uint32) error { return errUnsupportedOS }
func (*poller) wait(out []pollEvent) ([]pollEvent, error)   { return out, errUnsupportedOS }
func (*poller) wake()                                       {}
func (*poller) close()                                      {}
