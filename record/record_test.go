package record

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tokentap/tokentap/stream"
)

const msec = time.Millisecond

func at(base time.Time, msec float64) time.Time {
	return base.Add(time.Duration(msec * float64(time.Millisecond)))
}

// docsExample rebuilds the record of docs/records.md's example.
func docsExample(t *testing.T) *Record {
	t.Helper()
	start, err := time.Parse(time.RFC3339Nano, "2026-11-29T23:27:18.213378062Z")
	if err != nil {
		t.Fatal(err)
	}
	r := New(8)
	r.ID, r.Arrive, r.Traffic, r.API, r.Stream = "d3ac370d-1", start, "live", stream.NameChat, true
	r.SetModel("m1")
	r.Outcome, r.HTTPStatus, r.FinishReason = Success, 200, "length"
	r.InputTokens, r.OutputTokens, r.TokenSource = 7, 8, "usage"
	r.Events, r.UsageInjected = 11, true
	r.Upstream = Upstream{Asked: true, Reused: true}
	r.Upstream.Set(UpConnWait, 12*time.Microsecond)
	r.Upstream.Set(UpServer, 27874*time.Microsecond)
	r.FirstByte = at(start, 28.108)
	for _, m := range []float64{28.108, 42.647, 58.777, 77.335, 92.863, 108.582, 123.992, 139.724} {
		r.AddToken(at(start, m), 0, true)
	}
	r.Terminal = at(start, 139.724)
	return r
}

// The record's JSON is exactly the example that docs/records.md shows:
// a change to either shows up here.
func TestRecordJSONMatchesTheDocsExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```json\n(.*?)\n```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/records.md has no json example")
	}
	want := strings.ReplaceAll(string(m[1]), "\n ", "")
	got, err := docsExample(t).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("record JSON differs from docs/records.md:\n got %s\nwant %s", got, want)
	}
}

// Undefined quantities are null (never 0), optional fields appear only
// when set, and every line is valid JSON whatever the strings hold.
func TestMarshalJSONShapes(t *testing.T) {
	decode := func(r *Record) map[string]any {
		t.Helper()
		b, err := r.MarshalJSON()
		if err != nil || !json.Valid(b) {
			t.Fatalf("invalid JSON (%v): %s", err, b)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		return m
	}
	base := time.Unix(1000, 0)

	// No token at all: every latency but E2E is null, counts unknown.
	r := New(0)
	r.Arrive, r.Outcome, r.ErrorType, r.HTTPStatus = base, Error, ErrHTTP5xx, 502
	r.Terminal = at(base, 3)
	m := decode(r)
	for _, k := range []string{"ttfb_ms", "ttft_ms", "ttfot_ms", "tpot_ms", "max_itl_ms", "input_tokens", "output_tokens", "tokens_per_event"} {
		if v, ok := m[k]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", k, v, ok)
		}
	}
	if m["e2e_ms"] != 3.0 || m["terminal_ms"] != 3.0 || m["error_type"] != "http_5xx" {
		t.Errorf("e2e %v terminal %v error %v", m["e2e_ms"], m["terminal_ms"], m["error_type"])
	}
	for _, k := range []string{"malformed", "usage_injected", "tap_failed", "model_truncated", "error_code", "cached_tokens", "trace_id", "probe", "energy_j", "slo", "stalls"} {
		if _, ok := m[k]; ok {
			t.Errorf("%s present on a record that did not set it", k)
		}
	}

	// One token: TPOT undefined, not zero; a single event has no gap.
	r = New(1)
	r.Arrive, r.Stream, r.Outcome, r.OutputTokens = base, true, Success, 1
	r.AddToken(at(base, 10), 1, true)
	r.Terminal = at(base, 11)
	m = decode(r)
	if m["tpot_ms"] != nil || m["max_itl_ms"] != nil || m["ttft_ms"] != 10.0 {
		t.Errorf("one token: tpot %v max_itl %v ttft %v", m["tpot_ms"], m["max_itl_ms"], m["ttft_ms"])
	}
	if tpe, ok := m["tokens_per_event"].([]any); !ok || len(tpe) != 1 || tpe[0] != 1.0 {
		t.Errorf("tokens_per_event %v", m["tokens_per_event"])
	}

	// Hostile strings stay valid JSON; every optional field shows up.
	r = New(2)
	r.Arrive, r.Stream, r.Outcome = base, true, Success
	r.SetModel("a\"b\\c\n\x00\xff" + strings.Repeat("é", 300))
	r.Malformed, r.UsageInjected, r.TapFailed, r.ErrorCode, r.CachedTokens = true, true, "strip_overflow", 503, 4
	r.TraceID, r.SpanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	r.EnergyJ, r.EnergyDynamicJ, r.EnergySource, r.DecodeSOL = 1.23456, 0.5, "counter", 0.42
	f := 0.75
	r.SLO = []Verdict{{Name: "chat", Qualified: false, Failed: []string{"ttft"}, Fluidity: &f}}
	r.PromptClass, r.OutputClass, r.Stalls = "short", "short", 2
	r.Probe = &ProbeInfo{Name: "p", Scheduled: at(base, -1), Result: "failed", Check: "contains", Failure: "text \"x\""}
	r.Terminal = at(base, 5)
	m = decode(r)
	// The cut falls on a rune boundary: the kept "é"s are all whole.
	kept := strings.TrimPrefix(r.Model, "a\"b\\c\n\x00\xff")
	if !r.ModelTruncated || m["model_truncated"] != true || !utf8.ValidString(kept) || len(r.Model) > MaxModelBytes || len(r.Model) < MaxModelBytes-1 {
		t.Errorf("model kept %d bytes, truncated %v, cut on a rune boundary %v", len(r.Model), m["model_truncated"], utf8.ValidString(kept))
	}
	for k, want := range map[string]any{"malformed": true, "usage_injected": true, "tap_failed": "strip_overflow", "error_code": 503.0,
		"cached_tokens": 4.0, "trace_id": r.TraceID, "energy_j": 1.2346, "energy_source": "counter", "decode_sol_ratio": 0.42,
		"stalls": 2.0, "prompt_class": "short"} {
		if m[k] != want {
			t.Errorf("%s = %#v, want %#v", k, m[k], want)
		}
	}
	if p := m["probe"].(map[string]any); p["schedule_lag_ms"] != 1.0 || p["failure"] != `text "x"` {
		t.Errorf("probe %v", p)
	}
	if s := m["slo"].([]any)[0].(map[string]any); s["fluidity"] != 0.75 || len(s["not_applicable"].([]any)) != 0 {
		t.Errorf("slo %v", s)
	}
}

// Offsets are rounded to microseconds; derived quantities follow the
// definitions of docs/measurement.md §3.
func TestDerivedQuantities(t *testing.T) {
	base := time.Unix(1000, 0)
	r := New(4)
	r.Arrive = base
	r.FirstByte = at(base, 5)
	for i, m := range []float64{20, 30, 55, 60} {
		r.AddToken(at(base, m), int64(i%2+1), i > 0) // the first event is reasoning
	}
	r.OutputTokens, r.Terminal = 6, at(base, 61.0004)
	if d, _ := r.TTFT(); d != 20*msec {
		t.Errorf("TTFT %v", d)
	}
	if d, _ := r.TTFOT(); d != 30*msec {
		t.Errorf("TTFOT %v (reasoning excluded)", d)
	}
	if d, ok := r.TPOT(); !ok || d != 8*msec { // (60-20)/(6-1)
		t.Errorf("TPOT %v %v", d, ok)
	}
	if r.MaxGap != 25*msec || r.TokenEvents() != 4 || !r.PerEventKnown() {
		t.Errorf("max gap %v events %d per-event %v", r.MaxGap, r.TokenEvents(), r.PerEventKnown())
	}
	var gaps []time.Duration
	r.Gaps(func(d time.Duration) { gaps = append(gaps, d) })
	if len(gaps) != 3 || gaps[0] != 10*msec || gaps[1] != 25*msec || gaps[2] != 5*msec {
		t.Errorf("gaps %v", gaps)
	}
	b, _ := r.MarshalJSON()
	if !bytes.Contains(b, []byte(`"e2e_ms":61,`)) || !bytes.Contains(b, []byte(`"tokens_per_event":[1,2,1,2]`)) {
		t.Errorf("JSON %s", b)
	}
	// An event without a count makes the per-event list unknown.
	r.AddToken(at(base, 70), 0, true)
	if r.PerEventKnown() {
		t.Error("per-event counts still known after an event without one")
	}
	// Reset keeps the capacity: no allocation for the next request.
	if n := testing.AllocsPerRun(100, func() {
		r.Reset()
		r.Arrive = base
		for i := 0; i < 5; i++ {
			r.AddToken(at(base, float64(i)), 1, true)
		}
	}); n != 0 {
		t.Errorf("%.1f allocations per reused record", n)
	}
	if r.InputTokens != -1 || r.OutputTokens != -1 {
		t.Error("Reset does not make the counts unknown")
	}
}

// A stream (records: -) writes whole lines under concurrency.
func TestStreamWholeLines(t *testing.T) {
	var buf bytes.Buffer
	j := NewStream(&buf, FileOptions{})
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := New(1)
			r.Arrive, r.Outcome = time.Unix(1000, 0), Success
			r.SetModel(strings.Repeat("m", 200))
			j.Write(r)
		}()
	}
	wg.Wait()
	closeFile(t, j)
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if st := j.Stats(); len(lines) != 50 || st.Written != 50 || st.Dropped != 0 {
		t.Fatalf("%d lines, stats %+v", len(lines), st)
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("broken line %q", l)
		}
	}
}

// New's hint is a claim (a client's max_tokens): clamped to [0, MaxHint]
// rather than passed to make (issue 40, item 1).
func TestNewClampsItsHint(t *testing.T) {
	for _, c := range []struct{ hint, room int }{{-1, 0}, {0, 0}, {100, 100}, {MaxHint + 1, MaxHint}, {math.MaxInt, MaxHint}} {
		r := New(c.hint)
		if cap(r.TokenAt) != c.room || cap(r.TokensPerEvent) != c.room {
			t.Errorf("New(%d): room %d and %d, want %d", c.hint, cap(r.TokenAt), cap(r.TokensPerEvent), c.room)
		}
	}
}
