package slo

import (
	"encoding/json"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
)

// scored builds a book and its scorecard on a fake clock.
func scored(cost config.Cost, energy bool, reg prometheus.Registerer) (*Book, *Scorecard, *time.Time) {
	cfg := Config{Objectives: []Objective{{Name: "chat", Target: 0.95, Thresholds: Thresholds{TTFT: 500 * ms}}}}
	book := NewBook(cfg, nil)
	now := time.Unix(10_000, 0)
	book.clock = func() time.Time { return now }
	sc := NewScorecard(book, NewLoadBuckets(config.Capacity{LoadBuckets: []float64{2, 4, 8}}), cost, energy, reg)
	return book, sc, &now
}

// The hand-computed scorecard of docs/cost.md: 100 qualified requests of
// 3,330 tokens, one a second, and 10 failed ones of 1,000 tokens; read
// 100 s after the first.
//
//	goodput        333,000 tokens / 100 s = 3,330 tok/s
//	cost           11 EUR/h × 100 s = 0.305556 EUR
//	per 1M goodput 0.305556 / 333,000 × 1e6 = 0.917584 EUR
//	per 1M output  0.305556 / 343,000 × 1e6 = 0.890832 EUR
//	J/token        110 × 100 J / 343,000 = 0.0320700 J; dynamic 110 × 60 J / 343,000 = 0.0192420 J
//	energy share   11,000 J = 0.00305556 kWh × 0.25 EUR = 0.000763889 EUR; per 1M goodput 0.00229396 EUR
//	TTFT p99       rank ⌈0.99 × 110⌉ = 109 of 1..100 ms and 600..609 ms: 608 ms (5% buckets: ≤ 638.4 ms)
//	ITL p99        rank 208 of 200 gaps of 1 ms and 10 of 10 ms: 10 ms
func TestScorecardFigures(t *testing.T) {
	book, sc, now := scored(config.Cost{Currency: "EUR", PerGPUHour: 2.75, GPUs: 4, EnergyPerKWh: 0.25}, true, nil)
	j := NewJudge(book.cfg)
	t0 := *now
	add := func(r *record.Record) {
		judged(j, r)
		book.Add(r)
		sc.Add(r)
	}
	for i := range 100 {
		*now = t0.Add(time.Duration(i) * time.Second)
		r := rec(record.Success, 3330, 1+i, 2+i, 3+i) // TTFT 1..100 ms
		r.EnergyJ, r.EnergyDynamicJ, r.EnergySource = 100, 60, "counter"
		r.Load, r.LoadBucket = 3, "4"
		add(r)
	}
	for i := range 10 {
		r := rec(record.Success, 1000, 600+i, 610+i) // TTFT above 500 ms: not qualified
		r.EnergyJ, r.EnergyDynamicJ, r.EnergySource = 100, 60, "counter"
		r.Load, r.LoadBucket = 6, "8"
		add(r)
	}
	*now = t0.Add(100 * time.Second)
	p := sc.Page(*now)
	c := p.SLOs[0].Scorecard
	near := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || math.Abs(*got-want) > 1e-6*math.Abs(want) {
			t.Errorf("%s: %v, want %v", name, deref(got), want)
		}
	}
	near("goodput", &c.GoodputTokensRate, 3330)
	near("output rate", &c.OutputTokensRate, 3430)
	near("price", c.PricePerHour, 11)
	near("EUR per 1M goodput tokens", c.CostPerMillionGoodputTokens, 11.0/3600*100/333000*1e6)
	near("EUR per 1M output tokens", c.CostPerMillionOutputTokens, 11.0/3600*100/343000*1e6)
	if math.Round(*c.CostPerMillionGoodputTokens*100)/100 != 0.92 {
		t.Errorf("11 EUR/h at 3,330 goodput tok/s reads %v, not 0.92 EUR per 1M", *c.CostPerMillionGoodputTokens)
	}
	near("J per output token", c.JoulesPerOutputToken, 11000.0/343000)
	near("dynamic J per output token", c.DynamicJoulesPerOutputToken, 6600.0/343000)
	near("energy EUR per 1M goodput tokens", c.EnergyCostPerMillionGoodputTokens, 11000/3.6e6*0.25/333000*1e6)
	if c.TTFTP99Seconds == nil || *c.TTFTP99Seconds < 0.608 || *c.TTFTP99Seconds > 0.608*1.05 {
		t.Errorf("TTFT p99 %v, want the 109th of 110 (608 ms) within 5%% above", deref(c.TTFTP99Seconds))
	}
	if c.ITLP99Seconds == nil || *c.ITLP99Seconds < 0.010 || *c.ITLP99Seconds > 0.0105 {
		t.Errorf("ITL p99 %v, want 10 ms within 5%% above", deref(c.ITLP99Seconds))
	}
	if c.Energy != "on" || c.Currency != "EUR" || c.Verdict != p.SLOs[0].Verdict || c.SpanSeconds != 100 {
		t.Errorf("card %+v", c)
	}
	// The curve: 100 of 100 at load ≤ 4 meets 0.95; 0 of 10 at ≤ 8 are too few.
	if len(c.Curve) != 2 || c.Curve[0].Bucket != "4" || c.Curve[0].State != "meets" || c.Curve[1].State != "too_few" ||
		c.Knee.State != KneeEstimate || *c.Knee.Load != 4 || c.Knee.Evidence != 100 {
		t.Errorf("curve %+v knee %+v", c.Curve, c.Knee)
	}
}

// The scorecard divides by the span its row divides by, floored at 1 s:
// 3 requests of 4 tokens in 2.6 ms at 7.5 EUR/h read on the row 12
// tok/s, and so on the card (not 12 / 0.0026 = 4,615 tok/s), and cost
// 7.5 / 3600 EUR ÷ 12 tokens × 10⁶ = 173.61 EUR per 1M (not 0.45).
func TestScorecardSpanFloor(t *testing.T) {
	book, sc, now := scored(config.Cost{Currency: "EUR", PerHour: 7.5}, false, nil)
	j := NewJudge(book.cfg)
	t0 := *now
	for i := range 3 {
		*now = t0.Add(time.Duration(i) * 1300 * time.Microsecond)
		r := rec(record.Success, 4, 100, 140, 180, 220)
		r.Load, r.LoadBucket = 1, "2"
		judged(j, r)
		book.Add(r)
		sc.Add(r)
	}
	p := sc.Page(*now)
	row, c := p.SLOs[0], p.SLOs[0].Scorecard
	if row.SpanSeconds != 0.0026 || c.SpanSeconds != row.SpanSeconds {
		t.Fatalf("span: row %v, card %v; want the raw 0.0026 s on both", row.SpanSeconds, c.SpanSeconds)
	}
	if row.GoodputTokensRate != 12 || c.GoodputTokensRate != 12 || c.OutputTokensRate != 12 {
		t.Errorf("tok/s: row %v, card goodput %v, output %v; want 12 each", row.GoodputTokensRate, c.GoodputTokensRate, c.OutputTokensRate)
	}
	for name, got := range map[string]*float64{"goodput": c.CostPerMillionGoodputTokens, "output": c.CostPerMillionOutputTokens} {
		if got == nil || math.Round(*got*100)/100 != 173.61 {
			t.Errorf("EUR per 1M %s tokens: %v, want 173.61", name, deref(got))
		}
	}
	if len(c.Curve) != 1 || c.Curve[0].GoodputTokensRate != 12 {
		t.Errorf("curve %+v, want one bucket at 12 goodput tok/s", c.Curve)
	}
}

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

// No price, energy off: the page says so rather than show a number.
func TestScorecardWithoutPricesOrEnergy(t *testing.T) {
	book, sc, _ := scored(config.Cost{}, false, nil)
	r := rec(record.Success, 5, 100, 140, 180, 220, 260)
	judged(NewJudge(book.cfg), r)
	book.Add(r)
	sc.Add(r)
	c := sc.Page(book.clock()).SLOs[0].Scorecard
	if c.PricePerHour != nil || c.CostPerMillionGoodputTokens != nil || c.Energy != "off" || c.JoulesPerOutputToken != nil ||
		c.Knee.State != KneeNotEnoughEvidence || len(c.Curve) != 0 {
		t.Fatalf("card %+v", c)
	}
	w := httptest.NewRecorder()
	sc.ServeHTTP(w, httptest.NewRequest("GET", "/slo", nil))
	body := w.Body.String()
	for _, want := range []string{"no price declared", "energy off", "not enough evidence", "No request with a measured load"} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// /slo shows every figure with its definition linked, the knee and the
// plot; the JSON carries the card under each SLO.
func TestScorecardPage(t *testing.T) {
	book, sc, now := scored(config.Cost{Currency: "EUR", PerHour: 11}, false, nil)
	j := NewJudge(book.cfg)
	for i := range 120 { // 60 good at load ≤ 2 prove 0.957 ≥ 0.95
		*now = now.Add(100 * ms)
		r := rec(record.Success, 5, 100, 140, 180, 220, 260)
		r.Load, r.LoadBucket = 1.5, "2"
		if i%2 == 0 {
			r = rec(record.Success, 5, 900, 940)
			r.Load, r.LoadBucket = 6, "8"
		}
		judged(j, r)
		book.Add(r)
		sc.Add(r)
	}
	w := httptest.NewRecorder()
	sc.ServeHTTP(w, httptest.NewRequest("GET", "/slo", nil))
	body := w.Body.String()
	for _, want := range []string{"Scorecard: chat", "<svg", "knee", "load ≤ 2", "EUR", "the figure to plan with",
		DocsURL + "#goodput", DocsURL + "#cost-per-million-goodput-tokens", DocsURL + "#cost-per-million-output-tokens",
		DocsURL + "#joules-per-output-token", DocsURL + "#energy-share", DocsURL + "#ttft-p99-and-itl-p99",
		DocsURL + "#attainment-and-its-bound", DocsURL + "#the-knee", DocsURL + "#load", "(0, 2]", "(4, 8]"} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Every definition link lands on a heading of docs/cost.md.
	md, err := os.ReadFile("../docs/cost.md")
	if err != nil {
		t.Fatal(err)
	}
	slugs := map[string]bool{}
	for _, l := range strings.Split(string(md), "\n") {
		if h, ok := strings.CutPrefix(l, "### "); ok {
			slugs[strings.ReplaceAll(strings.ToLower(h), " ", "-")] = true
		}
	}
	for _, m := range regexp.MustCompile(regexp.QuoteMeta(DocsURL)+`#([a-z0-9-]+)`).FindAllStringSubmatch(body, -1) {
		if !slugs[m[1]] {
			t.Errorf("link #%s: no such heading in docs/cost.md", m[1])
		}
	}
	w = httptest.NewRecorder()
	sc.ServeHTTP(w, httptest.NewRequest("GET", "/slo?format=json", nil))
	var doc struct {
		SLOs []struct {
			Scorecard struct {
				Knee  Knee        `json:"knee"`
				Curve []LoadPoint `json:"curve"`
				Cost  *float64    `json:"cost_per_million_goodput_tokens"`
			} `json:"scorecard"`
		} `json:"slos"`
	}
	b, _ := io.ReadAll(w.Body)
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.SLOs) != 1 {
		t.Fatalf("%v\n%s", err, b)
	}
	card := doc.SLOs[0].Scorecard
	if card.Knee.State != KneeEstimate || card.Knee.Bucket != "2" || len(card.Curve) != 2 || card.Curve[1].State != "missed" || card.Cost == nil {
		t.Fatalf("json card %+v\n%s", card, b)
	}
	// The book alone still serves the page, without cards.
	w = httptest.NewRecorder()
	book.ServeHTTP(w, httptest.NewRequest("GET", "/slo", nil))
	if strings.Contains(w.Body.String(), "Scorecard:") || !strings.Contains(w.Body.String(), "chat") {
		t.Fatal("the book's own page")
	}
}

// The knee gauges: this instance's estimate, absent without evidence;
// the bucket bounds for the rules.
func TestKneeGauges(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	book, sc, _ := scored(config.Cost{}, false, reg)
	want := `# HELP tokentap_slo_load_bucket_bound The upper bound of each load bucket, by its load label: the knee rules read it to turn the label into a number.
# TYPE tokentap_slo_load_bucket_bound gauge
tokentap_slo_load_bucket_bound{load="+Inf"} +Inf
tokentap_slo_load_bucket_bound{load="2"} 2
tokentap_slo_load_bucket_bound{load="4"} 4
tokentap_slo_load_bucket_bound{load="8"} 8
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tokentap_slo_load_bucket_bound", "tokentap_slo_knee_load"); err != nil {
		t.Fatal(err)
	}
	j := NewJudge(book.cfg)
	for range 60 {
		r := good()
		r.Load, r.LoadBucket = 3, "4"
		judged(j, r)
		sc.Add(r)
	}
	want = `# HELP tokentap_slo_knee_evidence_requests Requests offered to the SLO in the knee's load bucket over the SLO's /slo window (present with tokentap_slo_knee_load).
# TYPE tokentap_slo_knee_evidence_requests gauge
tokentap_slo_knee_evidence_requests{slo="chat"} 60
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tokentap_slo_knee_evidence_requests"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(sc.kneeCollectorForTest(), "tokentap_slo_knee_load"); n != 1 {
		t.Fatalf("%d knee series", n)
	}
}

func (sc *Scorecard) kneeCollectorForTest() prometheus.Collector { return kneeCollector{sc} }

func TestLatencyHistogram(t *testing.T) {
	var h latHist
	if h.quantile(0.99) != nil {
		t.Fatal("empty")
	}
	for i := 1; i <= 1000; i++ {
		h.add(float64(i) / 1000)
	}
	var o latHist
	o.merge(&h)
	for _, q := range []float64{0.5, 0.99, 1} {
		exact := math.Ceil(q*1000) / 1000
		if got := *o.quantile(q); got < exact || got > exact*latRatio {
			t.Errorf("q%v: %v, exact %v", q, got, exact)
		}
	}
	h = latHist{}
	h.add(0)
	if got := *h.quantile(0.5); got != latBase {
		t.Errorf("zero: %v", got)
	}
}

// The packed histogram counts as a map of bucket → count would: random
// durations over eight decades, added to two histograms and merged, give
// every bucket's count and every quantile of the reference.
func TestLatencyHistogramMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ref := map[int16]int64{}
	var a, b latHist
	for i := range 20000 {
		sec := math.Pow(10, -7+8*rng.Float64())
		ref[latIndex(sec)]++
		if i%3 == 0 {
			a.add(sec)
		} else {
			b.add(sec)
		}
	}
	a.merge(&b)
	if a.n != 20000 || len(a.cells) != len(ref) {
		t.Fatalf("n %d, %d cells, %d buckets", a.n, len(a.cells), len(ref))
	}
	for k, c := range a.cells {
		i, n := int16(c>>latShift), int64(c&(1<<latShift-1))
		if ref[i] != n || (k > 0 && a.cells[k-1]>>latShift >= c>>latShift) {
			t.Fatalf("cell %d: bucket %d count %d, reference %d", k, i, n, ref[i])
		}
	}
	keys := slices.Sorted(maps.Keys(ref))
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 1} {
		rank, cum := int64(math.Ceil(q*20000)), int64(0)
		for _, k := range keys {
			if cum += ref[k]; cum >= rank {
				if want := latBase * math.Pow(latRatio, float64(k)); *a.quantile(q) != want {
					t.Errorf("q%v: %v, reference %v", q, *a.quantile(q), want)
				}
				break
			}
		}
	}
}

// A card's window full of histograms holds little: an hour of 1-minute
// slots, each with 64 buckets of first-token waits and of gaps, retains
// under 128 KiB of heap (8 bytes a bucket, doubled at most by the slices'
// growth: 120 KiB); it held 76 KB here. The map per histogram it replaced
// held 296 KB, and fails this test. Ten windows, so that the heap's own
// noise is small beside what they hold.
func TestCardWindowHistogramsAreSmall(t *testing.T) {
	const windows = 10
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	ws := make([]*cardWindow, windows)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range ws {
		ws[i] = newCardWindow(time.Hour, 60, 4)
		for s := range 60 {
			for k := range 64 {
				d := time.Duration(float64(time.Millisecond) * math.Pow(latRatio, float64(k)))
				r := &record.Record{Stream: true, Arrive: t0, FirstToken: t0.Add(d), TokenAt: []time.Duration{d, 2 * d}}
				ws[i].add(t0.Add(time.Duration(s)*time.Minute), r, &record.Verdict{}, -1)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / windows
	t.Logf("a window of 60 slots × 2 histograms × 64 buckets: %d bytes", held)
	if held > 128<<10 {
		t.Errorf("a window holds %d bytes", held)
	}
	runtime.KeepAlive(ws)
}

// The card counts the SLO's missed requests by cause: once under each
// (event, cause) pair a missed request had, "none" for a missed one with
// no slow event; qualified requests not at all.
func TestScorecardMissedByCause(t *testing.T) {
	book, sc, now := scored(config.Cost{}, false, nil)
	j := NewJudge(book.cfg)
	add := func(r *record.Record, cs ...record.Cause) {
		judged(j, r)
		r.Causes = cs
		book.Add(r)
		sc.Add(r)
	}
	q := record.Cause{What: "ttft", Cause: "queue", Ms: 700}
	st := record.Cause{What: "stall", Cause: "prefill_interference", Ms: 900, Ref: "r-1"}
	add(rec(record.Success, 10, 700, 710), q)         // missed: ttft queue
	add(rec(record.Success, 10, 700, 710), q, st, st) // missed: ttft queue, stall prefill_interference (once)
	add(rec(record.Error, 0))                         // missed: no slow event
	add(rec(record.Success, 10, 100, 110), st)        // qualified: not counted
	*now = now.Add(time.Second)
	c := sc.Page(*now).SLOs[0].Scorecard
	want := []CauseCount{{"ttft", "queue", 2}, {"stall", "prefill_interference", 1}, {"", "none", 1}}
	if len(c.MissedByCause) != len(want) {
		t.Fatalf("missed by cause %+v, want %+v", c.MissedByCause, want)
	}
	for i := range want {
		if c.MissedByCause[i] != want[i] {
			t.Errorf("missed by cause %+v, want %+v", c.MissedByCause, want)
		}
	}
	w := httptest.NewRecorder()
	sc.ServeHTTP(w, httptest.NewRequest("GET", "/slo", nil))
	if b := w.Body.String(); !strings.Contains(b, "missed, by cause") || !strings.Contains(b, "ttft queue: 2") {
		t.Errorf("the page does not list the missed requests by cause:\n%s", b)
	}
}
