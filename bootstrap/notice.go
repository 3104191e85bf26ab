package bootstrap

import "fmt"

// NoticeKind says what a Notice reports.
type NoticeKind int

const (
	// NoticeRankLost: a rank's heartbeat stream broke or went silent (it
	// died, hung or lost its network), or the rendezvous declared this
	// rank itself lost.
	NoticeRankLost NoticeKind = iota + 1
	// NoticeAbort: a rank called Abort.
	NoticeAbort
	// NoticeRendezvousLost: the rendezvous stopped or stopped answering.
	NoticeRendezvousLost
)

func (k NoticeKind) String() string {
	switch k {
	case NoticeRankLost:
		return "rank lost"
	case NoticeAbort:
		return "abort"
	case NoticeRendezvousLost:
		return "rendezvous lost"
	}
	return fmt.Sprintf("NoticeKind(%d)", int(k))
}

// Notice is an event of the job delivered by Client.Lost.
type Notice struct {
	Kind NoticeKind
	// Rank is the job rank concerned (its rank in the job, not in a group
	// made by Split); -1 for NoticeRendezvousLost.
	Rank   int
	Reason string
	group  string // the group a NoticeAbort aborted
}

func (n Notice) String() string {
	switch n.Kind {
	case NoticeRankLost:
		return fmt.Sprintf("rank %d lost: %s", n.Rank, n.Reason)
	case NoticeAbort:
		return fmt.Sprintf("abort from rank %d: %s", n.Rank, n.Reason)
	case NoticeRendezvousLost:
		return "rendezvous lost: " + n.Reason
	}
	return fmt.Sprintf("%v (rank %d): %s", n.Kind, n.Rank, n.Reason)
}

// Err returns the notice as an error wrapping ErrRankLost, ErrAborted or
// ErrRendezvousLost, for failing the operations it interrupts.
func (n Notice) Err() error {
	switch n.Kind {
	case NoticeRankLost:
		return fmt.Errorf("gccl bootstrap: %w: rank %d: %s", ErrRankLost, n.Rank, n.Reason)
	case NoticeAbort:
		return fmt.Errorf("gccl bootstrap: %w by rank %d: %s", ErrAborted, n.Rank, n.Reason)
	default:
		return fmt.Errorf("gccl bootstrap: %w: %s", ErrRendezvousLost, n.Reason)
	}
}
