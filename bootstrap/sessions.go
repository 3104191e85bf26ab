package bootstrap

import (
	"fmt"
	"sort"
	"sync"
)

// openSessions names the sessions whose connection to a rendezvous is
// open. A session stays up while any Client made from it (by Join, Split,
// Shrink or Grow) is open, so a Client a caller drops without Close keeps
// a connection that gRPC redials for ever once the rendezvous is gone;
// this package's tests check the list is empty when they end.
var openSessions struct {
	sync.Mutex
	m map[*session]string
}

func trackSession(s *session, addr string) {
	openSessions.Lock()
	defer openSessions.Unlock()
	if openSessions.m == nil {
		openSessions.m = map[*session]string{}
	}
	openSessions.m[s] = fmt.Sprintf("job rank %d (job %s) connected to %s", s.rank, s.cfg.JobID, addr)
}

func untrackSession(s *session) {
	openSessions.Lock()
	defer openSessions.Unlock()
	delete(openSessions.m, s)
}

// sessionsOpen describes the open sessions and the Clients keeping each up.
func sessionsOpen() []string {
	openSessions.Lock()
	var out []string
	for s, what := range openSessions.m {
		s.mu.Lock()
		groups := make([]string, 0, len(s.watchers))
		for c := range s.watchers {
			groups = append(groups, fmt.Sprintf("%q (rank %d of %d)", c.group, c.rank, c.size))
		}
		s.mu.Unlock()
		sort.Strings(groups)
		out = append(out, fmt.Sprintf("%s, held open by the unclosed Clients of groups %v", what, groups))
	}
	openSessions.Unlock()
	sort.Strings(out)
	return out
}
