package replay

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/workload"
)

func runMain(t *testing.T, env Env, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	err = Main(t.Context(), args, env)
	return out.String(), errb.String(), err
}

// Bad flags: every problem named at once, exit 2.
func TestMainBadFlags(t *testing.T) {
	_, stderr, err := runMain(t, Env{}, "--target", "ftp://x", "--time-scale", "0", "--rate", "2", "--rates", "1,3,2", "--max-in-flight", "0", "--api", "nope")
	if usage.ExitCode(err) != 2 {
		t.Fatalf("exit %d: %v", usage.ExitCode(err), err)
	}
	for _, want := range []string{"--trace is required", `--target: want the engine's http(s) base URL, got "ftp://x"`, "--time-scale must be above 0",
		"--rate and --rates: give one", "--rates: 2 after 3: the rates must increase", "--max-in-flight must be at least 1", `--api must be one of`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// Bad trace lines: a clear error naming the file and the line, exit 2;
// what was sent before the line is in the report, every request
// accounted for.
func TestMainBadTrace(t *testing.T) {
	_, sim := simulator(t, fastSim())
	url := loopback(t, sim)
	good := traceLine(0, 100, 4, []int64{0}, nil) + traceLine(5, 100, 4, []int64{0}, nil)
	for _, c := range []struct{ name, trace, want string }{
		{"malformed", good + "{\"timestamp\": 7, \"input_length\": }\n", "trace.jsonl:3: not a JSON object"},
		{"truncated", good + `{"timestamp": 9, "input_len`, "trace.jsonl:3: truncated: the last line ends without a newline"},
		{"decreasing", good + traceLine(2, 100, 4, nil, nil), "trace.jsonl:3: timestamp decreases: 2 after 5"},
		{"empty", "\n\n", "the trace has no request"},
		{"no model", good, "trace.jsonl:1: no model: the line names none (tokentap.model); give --model"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, "trace.jsonl", c.trace)
			model := []string{"--model", "m"}
			if c.name == "no model" {
				model = nil
			}
			stdout, stderr, err := runMain(t, Env{}, append([]string{"--trace", path, "--target", url}, model...)...)
			if usage.ExitCode(err) != 2 || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %q, want %q", usage.ExitCode(err), stderr, c.want)
			}
			if c.name != "empty" && c.name != "no model" && !strings.Contains(stdout, "scheduled 2 = sent 2 + not sent 0") {
				t.Errorf("the report of what was sent before the bad line:\n%s", stdout)
			}
		})
	}
}

// An unreachable target is said at once, naming it; exit 1.
func TestMainUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	path := writeFile(t, "trace.jsonl", traceLine(0, 100, 4, nil, nil))
	_, _, err = runMain(t, Env{}, "--trace", path, "--target", "http://"+addr, "--model", "m")
	if usage.ExitCode(err) != 1 || !strings.Contains(err.Error(), "target http://"+addr+" unreachable") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("exit %d: %v", usage.ExitCode(err), err)
	}
}

// lazyTrace is a trace of size bytes generated as it is read: lines a
// fixed gap apart, each padded to about 100 bytes; never held whole.
type lazyTrace struct {
	size, read int64
	line       int64
	gap        int64 // ms
	buf        []byte
}

func (l *lazyTrace) Read(p []byte) (int, error) {
	if l.read >= l.size {
		return 0, io.EOF
	}
	if len(l.buf) == 0 {
		l.buf = fmt.Appendf(l.buf[:0], `{"timestamp": %d, "input_length": 64, "output_length": 2, "hash_ids": [%d], "pad": "%s"}`+"\n",
			l.line*l.gap, l.line%7, strings.Repeat("x", 20))
		l.line++
	}
	n := copy(p, l.buf)
	n = int(min(int64(n), l.size-l.read))
	l.buf = l.buf[n:]
	l.read += int64(n)
	return n, nil
}

// A 10 GB trace is streamed, never loaded whole: --duration stops the
// replay after its first lines, and neither the bytes read nor the heap
// grow with the trace.
func TestMainStreamsAHugeTrace(t *testing.T) {
	_, sim := simulator(t, fastSim())
	url := loopback(t, sim)
	var src *lazyTrace
	open := func() (*workload.Reader, io.Closer, error) {
		src = &lazyTrace{size: 10 << 30, gap: 10}
		return workload.NewReader(src, workload.ReaderOptions{Name: "huge.jsonl"}), io.NopCloser(nil), nil
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var rep *Report
	stdout, stderr, err := runMain(t, Env{Open: open, Report: func(r *Report) { rep = r }},
		"--trace", "huge.jsonl", "--target", url, "--model", "m", "--duration", "300ms")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	s := rep.Steps[0]
	if s.StoppedBy != "duration" || s.Scheduled != 30 || s.Answered+sum(s.Failed) != s.Sent || src.read > 1<<20 {
		t.Errorf("%s; stopped by %q after %d bytes of %d\n%s", describe(s), s.StoppedBy, src.read, src.size, stdout)
	}
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 64<<20 {
		t.Errorf("the heap grew by %d bytes", grew)
	}
}
