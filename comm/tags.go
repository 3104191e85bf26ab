package comm

import "github.com/gccl/gccl/algo"

// Every message carries a transport.Tag whose top byte is the kind of
// operation it belongs to, so that a rank that meets a message of another
// operation than its own fails with ErrMismatch instead of misreading it.
// This is the one table of kinds.
const (
	// 1..8: a collective's plan messages, by algo.Collective.

	tagBarrier    uint8 = 32
	tagP2P        uint8 = 33 // Send/Recv and Group data
	tagSymArrive  uint8 = 34 // the symmetric-memory path's rounds (symexec.go)
	tagSymDepart  uint8 = 35
	tagDevArrive  uint8 = 36 // the device path's rounds (devexec.go)
	tagDevDepart  uint8 = 37
	tagP2PDesc    uint8 = 38 // a device send's description of its buffer (sendrecv_device.go)
	tagP2PAnswer  uint8 = 39 // the receiver's answer: p2pCopied or p2pSendData
	tagAllToAllV  uint8 = 40 // the variable-size collectives (vcoll.go)
	tagAllGatherV uint8 = 41
	tagCMAArrive  uint8 = 42 // the single-copy path's rounds (cmaexec.go)
	tagCMADepart  uint8 = 43
)

// tagKindName names a kind in errors.
func tagKindName(k uint8) string {
	switch k {
	case tagBarrier:
		return "Barrier"
	case tagP2P, tagP2PDesc, tagP2PAnswer:
		return "Send/Recv"
	case tagSymArrive, tagSymDepart:
		return "a collective on symmetric memory"
	case tagDevArrive, tagDevDepart:
		return "a collective on device buffers"
	case tagCMAArrive, tagCMADepart:
		return "a collective reading peers' memory"
	case tagAllToAllV:
		return "AllToAllV"
	case tagAllGatherV:
		return "AllGatherV"
	}
	return algo.Collective(k).String()
}
