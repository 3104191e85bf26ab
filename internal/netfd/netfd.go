// Package netfd takes a connected socket out of the net package, for code
// that drives the descriptor itself (its own epoll sets, raw system calls)
// after net has listened, dialled and run the handshake.
//
// Why a duplicate rather than the original: the only way to take a
// descriptor out of Go's netpoller is to close the net.Conn that holds it,
// and a duplicate keeps the connection open across that close.
package netfd

import (
	"net"

	"github.com/gccl/gccl/internal/errs"
)

// ErrNotSupported is returned where Dup is not implemented.
var ErrNotSupported = errs.New(errs.ErrNotSupported, "netfd: duplicating a socket is not supported on this OS")

// Dup returns a duplicate of c's descriptor, non-blocking and
// close-on-exec, which the caller owns. Closing c afterwards removes the
// original from the netpoller without ending the connection; the caller
// does that once it has set up what drives the duplicate, so that on a
// failure it can still fall back to c. c must implement syscall.Conn.
func Dup(c net.Conn) (int, error) { return dup(c) }
