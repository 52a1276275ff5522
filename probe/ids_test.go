package probe

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
)

// twoProbes runs, for 5.5 s of the bubble's time, a probe whose engine
// answers at once and one whose engine never answers (a 2.5 s timeout,
// at most one in flight: the rest not_sent), and returns every record
// and the prober.
func twoProbes(t *testing.T) ([]*record.Record, *Prober) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), `"model":"slow"`) {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"delta":{"content":"Paris"},"finish_reason":"stop"}]}`+"\n\n"+
			`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`+"\n\ndata: [DONE]\n\n")
	})
	var recs sink
	u, _ := url.Parse("http://engine.invalid")
	cfg := Config{Probes: []Def{
		{Name: "fast", Model: "fast", Interval: time.Second},
		{Name: "slow", Model: "slow", Interval: time.Second, Timeout: 2500 * time.Millisecond},
	}}.WithDefaults("m")
	p := New(Options{Config: cfg, Upstream: u, Transport: handlerTransport{h}, Pipeline: pipeline.New(pipeline.Options{Sinks: []record.Sink{&recs}})})
	runFor(p, 5500*time.Millisecond)
	recs.mu.Lock()
	defer recs.mu.Unlock()
	return append([]*record.Record(nil), recs.recs...), p
}

// Every probe record's id is unique and has one form, the live
// records': the prober's random prefix and one sequence number, for
// probes sent and not sent alike; /probes gives each result's record id.
func TestProbeRecordIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		recs, p := twoProbes(t)
		form := regexp.MustCompile(`^([0-9a-f]{8})-[0-9]+$`)
		ids, prefixes, outcomes := map[string]bool{}, map[string]bool{}, map[record.Outcome]int{}
		for _, r := range recs {
			m := form.FindStringSubmatch(r.ID)
			if m == nil {
				t.Fatalf("record id %q (probe %s, outcome %s) is not <prefix>-<n>", r.ID, r.Probe.Name, r.Outcome)
			}
			if ids[r.ID] {
				t.Fatalf("record id %q used twice", r.ID)
			}
			ids[r.ID], prefixes[m[1]] = true, true
			outcomes[r.Outcome]++
		}
		if len(prefixes) != 1 || outcomes[record.Success] < 5 || outcomes[record.NotSent] == 0 || outcomes[record.Timeout] == 0 {
			t.Fatalf("%d records, prefixes %v, outcomes %v: want one prefix across successes, timeouts and not_sent", len(recs), prefixes, outcomes)
		}
		n := 0
		for _, h := range p.History() {
			for _, res := range h.Recent {
				if !ids[res.RecordID] {
					t.Fatalf("/probes result %+v names record %q, which does not exist", res, res.RecordID)
				}
				n++
			}
		}
		if n != len(recs) {
			t.Fatalf("%d results on /probes, %d records", n, len(recs))
		}
	})
}

// /probes JSON writes an unknown count or timing as null, as records do:
// output_tokens of a probe not sent or timed out before any token, and
// its TTFT; a known count is a number.
func TestProbesJSONUnknownIsNull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, p := twoProbes(t)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest("GET", "/probes?format=json", nil))
		var page struct {
			Probes []struct {
				Name   string
				Recent []map[string]any
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil {
			t.Fatalf("%v: %s", err, w.Body)
		}
		seen := map[string]int{}
		for _, pr := range page.Probes {
			for _, r := range pr.Recent {
				v, present := r["output_tokens"]
				if !present {
					t.Fatalf("no output_tokens in %v", r)
				}
				switch r["outcome"] {
				case "success":
					if v != 1.0 {
						t.Fatalf("output_tokens %v on a success with usage 1", v)
					}
				case "not_sent", "timeout":
					if v != nil || r["ttft_ms"] != nil {
						t.Fatalf("output_tokens %v, ttft_ms %v on %s: want null", v, r["ttft_ms"], r["outcome"])
					}
				}
				seen[r["outcome"].(string)]++
			}
		}
		if seen["success"] == 0 || seen["not_sent"] == 0 || seen["timeout"] == 0 {
			t.Fatalf("results by outcome %v", seen)
		}
		w = httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest("GET", "/probes", nil))
		if !strings.Contains(w.Body.String(), "<td>–</td><td>–</td><td>–</td>") {
			t.Fatalf("the HTML page does not show unknown values as –:\n%s", w.Body)
		}
	})
}
