package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/prefix"
)

func statsMain(ctx context.Context, args []string, env Env) error {
	fs := flag.NewFlagSet("sidecar capture stats", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	asJSON := fs.Bool("json", false, "write the report as one JSON object")
	png := fs.String("png", "", "also draw the report into this PNG file")
	window := fs.Duration("window", 0, "a block is reused when seen within this long before (0: anywhere earlier in the trace)")
	sizes := fs.String("sizes", joinInts(DefaultSizes), "the ideal LRU caches' sizes, in blocks, increasing, comma-separated (at most 8)")
	maxIDs := fs.Int("max-ids", DefaultStatsMaxIDs, "ids each reuse window remembers at most (past it the oldest are forgotten, counted)")
	bin := fs.Duration("bin", time.Second, "the arrival-rate bin (widened to keep at most 600 bins)")
	blockSize := fs.Int64("block-size", 512, "tokens per hash id when the trace does not say")
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "Usage: sidecar capture stats [--json] [--png FILE] [flags] FILE\n\nPrefix reuse within and across replicas, the ideal prefix cache by size, ISL/OSL and the arrival rate of a trace (docs/capture.md, \"Trace statistics\").\n\n")
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
	bad := func(format string, a ...any) { problems = append(problems, fmt.Errorf(format, a...)) }
	if len(files) != 1 {
		bad("want one trace (merge replicas' captures first: sidecar capture merge), got %d", len(files))
	}
	o := StatsOptions{Window: *window, MaxIDs: *maxIDs, Bin: *bin, BlockSize: *blockSize}
	if o.Sizes, err = parseSizes(*sizes); err != nil {
		problems = append(problems, err)
	}
	if *window < 0 {
		bad("--window must not be negative")
	}
	if *maxIDs < 1 || *maxIDs > 1<<24 {
		bad("--max-ids: 1 to %d, got %d", 1<<24, *maxIDs)
	}
	if *bin < time.Millisecond {
		bad("--bin: at least 1ms, got %v", *bin)
	}
	if *blockSize < 1 || *blockSize > 1<<20 {
		bad("--block-size: 1 to %d, got %d", 1<<20, *blockSize)
	}
	if len(problems) > 0 {
		return &usage.Error{Err: errors.Join(problems...)}
	}
	r, c, err := env.Open(files[0], 0)
	if err != nil {
		return &usage.Error{Err: err}
	}
	defer c.Close()
	rep, err := Stats(ctx, files[0], r, o)
	if err != nil {
		return err
	}
	if *png != "" {
		if err := writePNG(*png, rep); err != nil {
			return fmt.Errorf("--png: %w", err)
		}
	}
	if *asJSON {
		e := json.NewEncoder(env.Stdout)
		e.SetIndent("", "  ")
		return e.Encode(rep)
	}
	return writeText(env.Stdout, rep)
}

// parseSizes reads --sizes.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > prefix.MaxBlocks {
			return nil, fmt.Errorf("--sizes: %q is not a size of 1 to %d blocks", f, prefix.MaxBlocks)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("--sizes: %d after %d: the sizes must increase", n, out[len(out)-1])
		}
		out = append(out, n)
	}
	if len(out) > MaxSizes {
		return nil, fmt.Errorf("--sizes: at most %d, got %d", MaxSizes, len(out))
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

// writeText writes the report for a person.
func writeText(w io.Writer, r *Report) error {
	b := new(strings.Builder)
	fmt.Fprintf(b, "trace %s: %d requests over %.3f s (mean %.2f req/s; peak %.2f req/s in %g s bins)\n",
		r.File, r.Requests, r.DurationS, r.Arrivals.MeanRPS, r.Arrivals.PeakRPS, r.Arrivals.BinS)
	win := "anywhere earlier in the trace"
	if r.WindowS != nil {
		win = "within " + (time.Duration(*r.WindowS * 1e9)).String()
	}
	fmt.Fprintf(b, "prompt blocks of %d tokens: %d; reused (seen %s): %d (%s): within a replica %d (%s), across replicas %d (%s)\n",
		r.BlockSize, r.Reuse.Blocks, win, r.Reuse.Reused, pct(r.Reuse.Share), r.Reuse.Within, pct(r.Reuse.WithinShare), r.Reuse.Across, pct(r.Reuse.AcrossShare))
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "replica\trequests\tblocks\treused\twithin\tacross\t\n")
	for _, p := range r.Replicas {
		name := p.Name
		if name == "" {
			name = "(unnamed)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t\n", name, p.Requests, p.Blocks, pct(p.Share), pct(p.WithinShare), pct(p.AcrossShare))
	}
	tw.Flush()
	b.WriteString("ideal LRU prefix cache, one for the whole trace:\n")
	for _, c := range r.IdealCache {
		fmt.Fprintf(b, "  %d blocks (%d tokens): %d blocks hit (%s)\n", c.SizeBlocks, c.SizeTokens, c.Hits, pct(c.Share))
	}
	for _, d := range []struct {
		name string
		d    Dist
	}{{"input_length", r.InputLen}, {"output_length", r.OutputLen}} {
		fmt.Fprintf(b, "%s: %d values, mean %.1f, p50 %d, p90 %d, p99 %d, max %d\n", d.name, d.d.Count, d.d.Mean, d.d.P50, d.d.P90, d.d.P99, d.d.Max)
	}
	if r.ForgottenIDs > 0 {
		fmt.Fprintf(b, "ids forgotten for the bound (--max-ids) before their window ended: %d (reuse then missed is counted new)\n", r.ForgottenIDs)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writePNG draws r into path (written whole, then renamed into place).
func writePNG(path string, r *Report) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".png-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	err = plot(tmp, r)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	return err
}
