package errs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gccl/gccl/internal/errs"
)

func TestSentinelsOfOneKindMatch(t *testing.T) {
	a := errs.New(errs.ErrNotSupported, "a: not supported")
	b := errs.New(errs.ErrNotSupported, "b: not supported")
	other := errs.New(errs.ErrClosed, "a: closed")
	for _, c := range []struct {
		err, target error
		want        bool
	}{
		{a, b, true},
		{b, a, true},
		{fmt.Errorf("wrapped: %w", a), b, true},
		{fmt.Errorf("wrapped: %w", a), errs.ErrNotSupported, true},
		{fmt.Errorf("wrapped: %w", errs.ErrNotSupported), a, true},
		{a, other, false},
		{other, errs.ErrNotSupported, false},
		{errors.New("gccl: not supported"), a, false},
		{a, errors.New("a: not supported"), false},
	} {
		if got := errors.Is(c.err, c.target); got != c.want {
			t.Errorf("errors.Is(%q, %q) = %v, want %v", c.err, c.target, got, c.want)
		}
	}
	if a.Error() != "a: not supported" {
		t.Errorf("text %q", a.Error())
	}
	if errs.New(a, "c").Is(errs.ErrNotSupported) != true {
		t.Error("a sentinel made from a sentinel is of its kind")
	}
}
