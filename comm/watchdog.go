package comm

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// reportLaggards logs, once an operation has waited long, which ranks have
// not reached it: the first question of any hang diagnosis. It runs in the
// background so the wait goes on undisturbed.
func (c *Comm) reportLaggards(op string, seq uint64, waited time.Duration) {
	go func() {
		late, err := c.rv.laggards(c, seq)
		switch {
		case err != nil:
			c.log.Warn(fmt.Sprintf("watchdog: %s #%d has waited %v; cannot tell which ranks are late: %v", op, seq, waited, err), "subsys", "COLL")
		case len(late) == 0:
			c.log.Warn(fmt.Sprintf("watchdog: %s #%d has waited %v; every rank has reached it (a peer may be stalled inside it)", op, seq, waited), "subsys", "COLL")
		default:
			c.log.Warn(fmt.Sprintf("watchdog: %s #%d has waited %v; ranks %v have not reached it", op, seq, waited, late), "subsys", "COLL")
		}
	}()
}

// localGroup is the ranks of an in-process communicator, each stored by
// its rank once made, so that the watchdog reads their progress directly.
type localGroup []atomic.Pointer[Comm]

// laggards lists the ranks that have not reached operation seq; a rank
// not made yet (Split) has reached nothing.
func (g localGroup) laggards(seq uint64) ([]int, error) {
	var late []int
	for r := range g {
		if c := g[r].Load(); c == nil || c.reached.Load() < seq {
			late = append(late, r)
		}
	}
	return late, nil
}

// bootstrapLaggards asks the rendezvous: every rank that waits long marks
// the operation as reached there, and ranks whose mark does not appear soon
// have not reached it (or are busy elsewhere without waiting).
func (c *Comm) bootstrapLaggards(seq uint64) ([]int, error) {
	key := func(r int) string { return "gccl/watchdog/" + strconv.FormatUint(seq, 10) + "/" + strconv.Itoa(r) }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.boot.Set(ctx, key(c.rank), nil); err != nil {
		return nil, err
	}
	// Give the other waiting ranks time to mark it too.
	time.Sleep(time.Second)
	var mu sync.Mutex
	var late []int
	var wg sync.WaitGroup
	for r := 0; r < c.size; r++ {
		if r == c.rank {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			gctx, gcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer gcancel()
			if _, err := c.boot.Get(gctx, key(r)); err != nil {
				mu.Lock()
				late = append(late, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(late)
	return late, nil
}
