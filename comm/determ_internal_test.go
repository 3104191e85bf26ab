package comm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A rank whose setting differs from its peers' fails with ErrMismatch (the
// deterministic path's messages carry another argument check), whatever
// the sizes would otherwise let through; nobody hangs.
func TestDeterministicSettingMismatch(t *testing.T) {
	for _, count := range []int{2, 1000, 100000} {
		cs, err := InitLocal(2, &Config{Deterministic: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cs[1].cfg.Deterministic = false
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]float32, count)
				errs[r] = AllReduce(context.Background(), c, buf, buf, Sum)
			}()
		}
		wg.Wait()
		for _, c := range cs {
			c.Close()
		}
		if !errors.Is(errs[0], ErrMismatch) && !errors.Is(errs[1], ErrMismatch) {
			t.Fatalf("count %d: one deterministic rank, one not: %v; want ErrMismatch", count, errs)
		}
	}
}
