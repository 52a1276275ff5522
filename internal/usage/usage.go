// Package usage marks bad input to one of the binary's commands (a flag,
// an environment variable, a configuration file, a trace line), which
// ends the process with exit code 2, apart from every other failure (1).
// The sidecar (app) and tokentap replay (replay) share it.
package usage

import "errors"

// Error is bad input: the process exits 2. Err says what was wrong; it
// is never nil where the error is made.
type Error struct{ Err error }

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ExitCode maps a command's error to the process exit code: 0 for nil,
// 2 for an Error anywhere in its chain, 1 otherwise.
func ExitCode(err error) int {
	var ue *Error
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}
