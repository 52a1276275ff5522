package usage

import (
	"errors"
	"fmt"
	"testing"
)

func TestExitCode(t *testing.T) {
	bad := &Error{errors.New("--rate: not a number")}
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("target unreachable"), 1},
		{bad, 2},
		{fmt.Errorf("replay: %w", bad), 2},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	if bad.Error() != "--rate: not a number" || errors.Unwrap(bad) != bad.Err {
		t.Errorf("Error %q, Unwrap %v", bad.Error(), errors.Unwrap(bad))
	}
}
