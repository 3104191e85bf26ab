package p2p

import (
	"errors"

	"github.com/gccl/gccl/internal/errs"
)

var (
	// ErrRemoteDisconnect: the peer's process died, closed its agent or went
	// silent for longer than Config.PeerTimeout.
	ErrRemoteDisconnect = errors.New("p2p: remote agent disconnected")
	// ErrTimeout: the request did not finish within Config.RequestTimeout.
	ErrTimeout error = errs.New(errs.ErrTimeout, "p2p: transfer timed out")
	// ErrUnknownPeer: no metadata of that agent is loaded.
	ErrUnknownPeer = errors.New("p2p: unknown remote agent")
	// ErrOutOfBounds: a descriptor is not inside one registered region (on the
	// initiator's side from the target's metadata, or refused by the target).
	ErrOutOfBounds = errors.New("p2p: descriptor outside the registered regions")
	// ErrRegionBusy: the region is used by a prepared list or a request.
	ErrRegionBusy = errors.New("p2p: region in use")
	// ErrNotSupported: the memory type or backend does not exist on this
	// system (VRAM without a CUDA driver or without cgo, shared memory off
	// Linux).
	ErrNotSupported error = errs.New(errs.ErrNotSupported, "p2p: not supported on this system")
	// ErrClosed: the agent is closed.
	ErrClosed error = errs.New(errs.ErrClosed, "p2p: agent closed")
	// ErrBadMetadata: a metadata blob or wire message could not be parsed.
	ErrBadMetadata = errors.New("p2p: malformed metadata")
	// ErrRequestActive: the request is still in progress (Post again, Release).
	ErrRequestActive = errors.New("p2p: request in progress")
	// ErrInvalidArgument: MakeRequest (or CreateRequest) got descriptors that
	// do not make a transfer: mismatched lengths or parts, indices out of
	// range, or ranges of this agent where the source overlaps the destination.
	ErrInvalidArgument error = errs.New(errs.ErrInvalidArgument, "p2p: invalid argument")
)
