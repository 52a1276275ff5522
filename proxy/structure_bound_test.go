package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/structure"
)

// gatedCheck is a Structure that holds each check until released and
// measures the CPU time (the process's, user and system) the checker's
// own Record takes.
type gatedCheck struct {
	k       *structure.Checker
	entered chan struct{}
	release chan struct{}
	cpu     time.Duration
}

func (g *gatedCheck) Collector(d *stream.Declared) *stream.Collector { return g.k.Collector(d) }

func (g *gatedCheck) Record(rec *record.Record, d *stream.Declared, col *stream.Collector, partial, truncated, lost bool) {
	g.entered <- struct{}{}
	<-g.release
	before := processCPU()
	g.k.Record(rec, d, col, partial, truncated, lost)
	g.cpu = processCPU() - before
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// hostileSchemas are the two: 1,500 levels of properties (about
// 62 KB), and 60,000 properties each with a pattern (about 3.4 MB).
func hostileSchemas() map[string]string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range 60000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string","pattern":"^[a-z]{%d}[0-9]x+$"}`, i, i%50+1)
	}
	b.WriteString(`}}`)
	return map[string]string{
		structure.WhySchemaDepth: strings.Repeat(`{"type":"object","properties":{"abcdef":`, 1500) + "{}" + strings.Repeat("}}", 1500),
		structure.WhySchemaBytes: b.String(),
	}
}

// TestHostileSchemaNeverHoldsTheClient (issue 34): a request whose tool
// declares one of the hostile schemas (16 s and 24 s of CPU,
// the client's response held 12 s, before the bounds). The check runs
// with the end stages, after the response: held there until the client
// has read its whole answer, it delays the client's last byte by
// nothing at all, and the client gets the same bytes as the same
// request through a proxy without the check. Released, the check costs
// at most 50 ms of CPU (measured around it) and the record says
// unchecked with the bound that refused the schema, counted under
// tokentap_structure_unchecked_total{reason}. The body's peek (the
// schema is in it) stays on the PeekBudget while the check is held, and
// is given back once it has run.
func TestHostileSchemaNeverHoldsTheClient(t *testing.T) {
	answer := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"abcdef\":{}}"}}]},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n"
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, answer)
	})
	for why, schema := range hostileSchemas() {
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":` + schema + `}}]}`
		post := func(url string) []byte {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		plain, _ := front(t, up, Options{PeekBytes: 8 << 20, InjectUsage: false})
		want := post(plain.URL)

		g := &gatedCheck{k: &structure.Checker{}, entered: make(chan struct{}, 1), release: make(chan struct{})}
		var ends Ends
		budget := NewPeekBudget(64 << 20)
		fs, sink, m := judged(t, up, Options{PeekBytes: 8 << 20, Structure: g, Ends: &ends, PeekBudget: budget})
		got := post(fs.URL) // the whole answer, to its EOF, while the check is held
		<-g.entered
		if budget.Held() < int64(len(body)) {
			t.Errorf("%s: %d bytes on the peek budget while the check reads the %d-byte body", why, budget.Held(), len(body))
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the client got %q, without the check %q", why, got, want)
		}
		close(g.release)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := ends.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if budget.Held() != 0 {
			t.Errorf("%s: %d bytes still on the peek budget after the check", why, budget.Held())
		}
		r := only(t, sink)
		if r.Outcome != record.Success || r.Structure != structure.Unchecked || r.StructureUnchecked != why {
			t.Fatalf("%s: outcome %s, structure %q %q", why, r.Outcome, r.Structure, r.StructureUnchecked)
		}
		if g.cpu > 50*time.Millisecond {
			t.Errorf("%s (%d bytes): the check took %v of CPU, bound 50ms", why, len(schema), g.cpu)
		}
		if c := counterValue(t, m, "tokentap_structure_unchecked_total", "reason", why); c != 1 {
			t.Errorf("tokentap_structure_unchecked_total{reason=%q} = %v, want 1", why, c)
		}
		t.Logf("a %d-byte schema: the client's %d bytes read whole with the check held; then %s in %v of CPU", len(schema), len(got), why, g.cpu)
	}
}
