// Package cli is `sidecar capture`: the commands that read workload
// captures after the fact (docs/capture.md). `merge` joins the captures
// of many replicas into one trace in arrival order; `stats` says what a
// trace holds: prefix reuse within and across replicas, the ideal
// prefix cache's hits by size (package prefix), the length
// distributions and the arrival rate, as text, JSON or a PNG plot.
// Every input streams: memory is bounded by the lines in flight and the
// ids remembered (bounded, counted), never by a file's size.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tokentap/tokentap/internal/secret"
	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/workload"
)

// Env is what the commands need from the process.
type Env struct {
	Stdout, Stderr io.Writer
	// Open, if set, opens a trace in place of workload.Open (tests).
	Open Open
}

const usageText = `Usage:
  sidecar capture merge [-o FILE] FILE...
      the captures of many replicas as one trace, in arrival order (stdout by default)
  sidecar capture stats [--json] [--png FILE] [flags] FILE
      prefix reuse within and across replicas, the ideal cache by size, lengths, arrival rate
  sidecar capture install-key --from FILE --to FILE
      copies a mounted secret into a 0600 file the sidecar may read (the chart's init step)

docs/capture.md, "Merging replicas" and "Trace statistics".
`

// Main runs `sidecar capture` with args (after "capture"). Bad flags or
// bad input lines are a *usage.Error (exit 2), reported on env.Stderr
// here; other errors are returned for the caller to report (exit 1).
func Main(ctx context.Context, args []string, env Env) error {
	if env.Open == nil {
		env.Open = workload.Open
	}
	if len(args) == 0 {
		io.WriteString(env.Stderr, usageText)
		return &usage.Error{Err: errors.New("capture: want a command, merge or stats")}
	}
	var err error
	switch args[0] {
	case "merge":
		err = mergeMain(ctx, args[1:], env)
	case "stats":
		err = statsMain(ctx, args[1:], env)
	case "install-key":
		err = installKeyMain(args[1:], env)
	case "-h", "-help", "--help", "help":
		io.WriteString(env.Stdout, usageText)
		return nil
	default:
		io.WriteString(env.Stderr, usageText)
		err = &usage.Error{Err: fmt.Errorf("unknown command %q: want merge or stats", args[0])}
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	var le *workload.LineError
	if errors.As(err, &le) {
		err = &usage.Error{Err: err}
	}
	if usage.ExitCode(err) == 2 {
		fmt.Fprintf(env.Stderr, "sidecar capture %s: %v\n", args[0], err)
	}
	return err
}

// parseAll parses flags given before, between or after the positional
// arguments, and returns the positional ones.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func mergeMain(ctx context.Context, args []string, env Env) error {
	fs := flag.NewFlagSet("sidecar capture merge", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	out := fs.String("o", "", "write the merged trace to this file (written whole, then renamed into place); empty: stdout")
	maxIDs := fs.Int("max-ids", DefaultMaxIDs, "ids in each of the two generations of the renumbering tables (they bound memory)")
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "Usage: sidecar capture merge [-o FILE] FILE...\n\nMerges the captures of many replicas into one trace in arrival order, ids renumbered (docs/capture.md, \"Merging replicas\").\n\n")
		fs.PrintDefaults()
	}
	files, err := parseAll(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usage.Error{Err: err}
	}
	var problems []error
	if len(files) == 0 {
		problems = append(problems, errors.New("no trace given (sidecar capture merge [-o FILE] FILE...)"))
	}
	if *maxIDs < 1 || *maxIDs > 1<<24 {
		problems = append(problems, fmt.Errorf("--max-ids: 1 to %d, got %d", 1<<24, *maxIDs))
	}
	if len(problems) > 0 {
		return &usage.Error{Err: errors.Join(problems...)}
	}
	o := MergeOptions{MaxIDs: *maxIDs, Note: func(s string) { fmt.Fprintf(env.Stderr, "sidecar capture merge: %s\n", s) }}
	open := func(p string, maxLine int) (*workload.Reader, io.Closer, error) {
		r, c, err := env.Open(p, maxLine)
		if err != nil {
			return nil, nil, &usage.Error{Err: err} // a missing or unreadable input
		}
		return r, c, nil
	}
	if *out == "" {
		_, err := Merge(ctx, env.Stdout, files, open, o)
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".merge-*")
	if err != nil {
		return &usage.Error{Err: fmt.Errorf("-o: %w", err)}
	}
	defer os.Remove(tmp.Name()) // gone once renamed, or on failure
	_, err = Merge(ctx, tmp, files, open, o)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), *out)
	}
	return err
}

// installKeyMain copies the fleet's capture secret from a Kubernetes
// Secret volume (root's file) into a 0600 file of the sidecar's user
// (secret.Install; docs/capture.md, "Kubernetes").
func installKeyMain(args []string, env Env) error {
	fs := flag.NewFlagSet("sidecar capture install-key", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	from := fs.String("from", "", "the mounted secret file (required)")
	to := fs.String("to", "", "the file to write, mode 0600 (required)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usage.Error{Err: err}
	}
	if *from == "" || *to == "" || fs.NArg() > 0 {
		return &usage.Error{Err: errors.New("want --from FILE --to FILE and nothing else")}
	}
	if err := secret.Install(*from, *to); err != nil {
		return &usage.Error{Err: err}
	}
	return nil
}
