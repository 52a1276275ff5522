package slo

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/exporter"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

const ms = time.Millisecond

// rec builds a finished streamed record: token events at the given
// offsets (ms from arrival), n output tokens, terminal at the last token
// plus 1 ms.
func rec(outcome record.Outcome, n int64, at ...int) *record.Record {
	r := record.New(len(at))
	r.Arrive = time.Unix(1000, 0)
	r.API, r.Traffic, r.Model, r.Stream = stream.NameChat, "live", "m", true
	r.Outcome, r.OutputTokens, r.InputTokens = outcome, n, 100
	for _, a := range at {
		r.AddToken(r.Arrive.Add(time.Duration(a)*ms), 0, true)
	}
	end := 1
	if len(at) > 0 {
		end = at[len(at)-1] + 1
	}
	r.Terminal = r.Arrive.Add(time.Duration(end) * ms)
	return r
}

func objective() Objective {
	return Objective{Name: "chat", Target: 0.95, Thresholds: Thresholds{
		TTFT: 500 * ms, TTFOT: 600 * ms, TPOT: 50 * ms, E2E: 2 * time.Second, MaxITL: 200 * ms, MinOutputTokens: 2,
		Fluidity: 0.9}, Fluidity: FluiditySchedule{Deadline: 600 * ms, Cadence: 100 * ms}}
}

func judge(o Objective, r *record.Record) record.Verdict {
	v, ok := Evaluate(&o, r)
	if !ok {
		panic("out of scope")
	}
	return v
}

// judged sets the judge's verdict into r, as the pipeline does.
func judged(j *Judge, r *record.Record) {
	v := j.Judge(r)
	r.PromptClass, r.OutputClass, r.Stalls, r.SLO = v.PromptClass, v.OutputClass, v.Stalls, v.SLO
}

// A good request: TTFT 100 ms, then a token every 40 ms, 5 tokens.
func good() *record.Record { return rec(record.Success, 5, 100, 140, 180, 220, 260) }

func TestVerdictAllMet(t *testing.T) {
	v := judge(objective(), good())
	if !v.Qualified || len(v.Failed) != 0 || len(v.NotApplicable) != 0 || v.Fluidity == nil || *v.Fluidity != 1 {
		t.Fatalf("%+v", v)
	}
}

// Each threshold failing alone fails exactly that threshold.
func TestVerdictEachThresholdAlone(t *testing.T) {
	cases := map[string]*record.Record{
		TTFT:         rec(record.Success, 5, 501, 540, 580, 620, 660), // TTFT 501 ms > 500; fluidity: due 600,700,… all met
		E2E:          func() *record.Record { r := good(); r.Terminal = r.Arrive.Add(2001 * ms); return r }(),
		TPOT:         rec(record.Success, 3, 100, 190, 201),                                     // (201-100)/2 = 50.5 ms > 50; max gap 90
		MaxITL:       rec(record.Success, 10, 100, 110, 120, 321, 330, 340, 350, 360, 370, 380), // gap 201 > 200; TPOT 280/9 = 31 ms
		OutputTokens: rec(record.Success, 1, 100),                                               // 1 < 2 (TPOT, max_itl n/a)
	}
	cases[TTFOT] = good()
	cases[TTFOT].FirstOutputToken = cases[TTFOT].Arrive.Add(601 * ms) // reasoning until 601 ms
	for want, r := range cases {
		t.Run(want, func(t *testing.T) {
			o := objective()
			o.Thresholds.Fluidity = 0 // fluidity is tested on its own below
			v := judge(o, r)
			if v.Qualified || !reflect.DeepEqual(v.Failed, []string{want}) {
				t.Fatalf("failed %v (na %v), want exactly [%s]", v.Failed, v.NotApplicable, want)
			}
		})
	}
	// fluidity alone (TPOT and max_itl off): tokens at 100, 400, 700, 1000,
	// 1300 ms against D = 600, c = 100. 100 ≤ 600 → next due 700; 400 ≤ 700
	// → 800; 700 ≤ 800 → 900; 1000 > 900 overshoots 900 only (1000 is not
	// overshot) → 1 miss, restart: due 1100; 1300 > 1100 overshoots 1100 and
	// 1200 → 2 misses and 1 extra deadline. Deadlines 5 + 1 = 6, misses 3:
	// fluidity 1 − 3/6 = 0.5 < 0.9.
	o := objective()
	o.Thresholds.TPOT, o.Thresholds.MaxITL = 0, 0
	v := judge(o, rec(record.Success, 5, 100, 400, 700, 1000, 1300))
	if !reflect.DeepEqual(v.Failed, []string{Fluidity}) || math.Abs(*v.Fluidity-0.5) > 1e-12 {
		t.Fatalf("fluidity alone: failed %v score %v, want [fluidity] and 0.5", v.Failed, *v.Fluidity)
	}
}

func TestVerdictOneTokenTPOTNotApplicable(t *testing.T) {
	o := objective()
	o.Thresholds.MinOutputTokens = 1
	v := judge(o, rec(record.Success, 1, 100))
	if !v.Qualified || !reflect.DeepEqual(v.NotApplicable, []string{TPOT, MaxITL}) {
		t.Fatalf("one token: %+v, want qualified with tpot and max_itl not applicable", v)
	}
}

func TestVerdictNonStreamingSkipsStreamThresholds(t *testing.T) {
	r := rec(record.Success, 20)
	r.Stream = false
	v := judge(objective(), r)
	if !v.Qualified || !reflect.DeepEqual(v.NotApplicable, []string{TTFT, TTFOT, TPOT, MaxITL, Fluidity}) {
		t.Fatalf("%+v", v)
	}
}

// Errors, rejections, timeouts and responses that carry no answer (a
// redirect: issue 40) stay in the denominator as failures; cancellations
// too by default, or are excluded (and counted) when the
// SLO says so.
func TestDenominator(t *testing.T) {
	reg := prometheus.NewRegistry()
	off := false
	cfg := Config{Objectives: []Objective{objective(), func() Objective {
		o := objective()
		o.Name, o.CountCancelled = "no-cancel", &off
		return o
	}()}}
	j, book := NewJudge(cfg), NewBook(cfg, reg)
	m := exporter.New(exporter.Config{SLOs: []string{"chat", "no-cancel"}})
	for _, r := range []*record.Record{
		good(), rec(record.Error, 0), rec(record.Rejected, 0), rec(record.Timeout, 1, 100), rec(record.Cancelled, 2, 100, 130),
		rec(record.NoAnswer, 0),
	} {
		judged(j, r)
		m.Publish(r, record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic})
		book.Add(r)
	}
	check := func(what, metric string, want float64, labels ...string) {
		vec, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := math.NaN()
		for _, f := range vec {
			if f.GetName() != metric {
				continue
			}
		next:
			for _, x := range f.GetMetric() {
				for i, l := range x.GetLabel() {
					if l.GetValue() != labels[i] {
						continue next
					}
				}
				got = x.GetCounter().GetValue()
			}
		}
		if got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("offered chat", "tokentap_slo_requests_total", 6, "chat")
	check("qualified chat", "tokentap_slo_qualified_requests_total", 1, "chat")
	for _, o := range []string{"error", "rejected", "timeout", "cancelled", "no_answer"} {
		check("failures chat "+o, "tokentap_slo_failures_total", 1, "chat", o)
	}
	check("offered no-cancel", "tokentap_slo_requests_total", 5, "no-cancel")
	check("excluded no-cancel", "tokentap_slo_excluded_total", 1, "cancelled", "no-cancel")
	check("qualified tokens", "tokentap_slo_qualified_output_tokens_total", 5, "chat")
	p := book.Status(time.Now())
	if p.SLOs[0].Offered != 6 || p.SLOs[0].Qualified != 1 || p.SLOs[1].Offered != 5 || math.Abs(*p.SLOs[0].Attainment-1.0/6) > 1e-12 {
		t.Fatalf("window view %+v", p.SLOs)
	}
	if p.SLOs[0].Verdict != "missed" {
		t.Fatalf("1/6 against 0.95: verdict %s", p.SLOs[0].Verdict)
	}
}

func TestScope(t *testing.T) {
	o := objective()
	o.Scope = Scope{Models: []string{"other"}, Traffic: []string{"live"}}
	if _, ok := Evaluate(&o, good()); ok {
		t.Fatal("model m is not in scope [other]")
	}
	o.Scope = Scope{APIs: []string{"chat"}, Traffic: []string{"live"}, PromptClasses: []string{"short"}}
	r := good()
	r.PromptClass = classify(r.InputTokens, config.DefaultPromptClasses())
	if _, ok := Evaluate(&o, r); !ok || r.PromptClass != "short" {
		t.Fatalf("class %q should be in scope", r.PromptClass)
	}
}

// Fluidity on sequences built by hand; D = 600 ms, c = 100 ms unless said.
func TestFluidity(t *testing.T) {
	s := FluiditySchedule{Deadline: 600 * ms, Cadence: 100 * ms}
	cases := []struct {
		name string
		at   []int
		per  []int32
		want float64
	}{
		// Due 600, 700, 800, 900: all on time → 1.
		{"on time", []int{100, 200, 300, 400}, nil, 1},
		// First token at 650 > 600: overshoots 600 only (700 not yet) → 1 miss;
		// restart: due 750, 850 → tokens at 700, 800 on time. 1 − 1/3.
		{"late first token", []int{650, 700, 800}, nil, 1 - 1.0/3},
		// A stall across several deadlines: tokens at 100, 200 (due 600, 700,
		// on time), then 1050 against due 800: overshoots 800, 900, 1000 → 3
		// misses and 2 extra deadlines; restart: due 1150, token at 1100 on
		// time. Deadlines 4 + 2 = 6, misses 3 → 0.5.
		{"stall across deadlines", []int{100, 200, 1050, 1100}, nil, 0.5},
		// Schedule restart after a late token: 700 > 600 exactly one deadline
		// (600; 700 is not overshot) → miss, restart: due 800. Next token 850
		// > 800 → miss, restart: due 950. Next 900 on time, due 1050; 1000 on
		// time. Without the restart 900 and 1000 would be late against 800,
		// 900. Deadlines 4, misses 2 → 0.5.
		{"restart after late token", []int{700, 850, 900, 1000}, nil, 0.5},
		// A multi-token event: 3 tokens at 100 (due 600, 700, 800), 1 at 1000
		// (due 900: late by 100, overshoots 900 only) → 1 − 1/4.
		{"multi-token event", []int{100, 1000}, []int32{3, 1}, 0.75},
		// Exactly on a deadline is on time.
		{"on the deadline", []int{600, 700}, nil, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rec(record.Success, int64(len(c.at)), c.at...)
			if c.per != nil {
				r.TokenAt = r.TokenAt[:0]
				r.TokensPerEvent = r.TokensPerEvent[:0]
				r2 := record.New(4)
				r2.Arrive = r.Arrive
				for i, a := range c.at {
					r2.AddToken(r.Arrive.Add(time.Duration(a)*ms), int64(c.per[i]), true)
				}
				r = r2
			}
			if got := FluidityScore(r, s); math.Abs(got-c.want) > 1e-12 {
				t.Fatalf("fluidity %v, want %v", got, c.want)
			}
		})
	}
}

// The Wilson lower bound is checked against an independent computation:
// it is, by definition, the smaller root p₀ of the score test
// (p̂ − p₀)² = z² p₀(1−p₀)/n, which we find by bisection on
// f(p₀) = (p̂ − p₀) − z·sqrt(p₀(1−p₀)/n) over [0, p̂]. The closed forms for
// k = 0 (bound 0) and k = n (bound n/(n+z²)) are checked too.
func TestWilsonLower(t *testing.T) {
	bisect := func(k, n float64) float64 {
		p := k / n
		lo, hi := 0.0, p
		for i := 0; i < 200; i++ {
			mid := (lo + hi) / 2
			if (p - mid) > Z95*math.Sqrt(mid*(1-mid)/n) {
				lo = mid
			} else {
				hi = mid
			}
		}
		return (lo + hi) / 2
	}
	for _, c := range []struct{ k, n float64 }{{0, 1}, {0, 20}, {20, 20}, {1, 1}, {19, 20}, {95, 100}, {950, 1000}, {1, 10}, {9990, 10000}, {3, 7}} {
		got := WilsonLower(c.k, c.n, Z95)
		want := bisect(c.k, c.n)
		if c.k == 0 {
			want = 0
		}
		if c.k == c.n && math.Abs(got-c.n/(c.n+Z95*Z95)) > 1e-12 {
			t.Errorf("%v/%v: %v, closed form n/(n+z²) = %v", c.k, c.n, got, c.n/(c.n+Z95*Z95))
		}
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("WilsonLower(%v/%v) = %.12f, bisection says %.12f", c.k, c.n, got, want)
		}
	}
	// 20 good out of 20 does not prove 99%: the bound is 20/(20+z²) = 0.8808.
	if b := WilsonLower(20, 20, Z95); math.Abs(b-0.880842) > 1e-6 || b >= 0.99 {
		t.Errorf("20/20 lower bound %v", b)
	}
	if WilsonLower(0, 0, Z95) != 0 || WilsonUpper(0, 0, Z95) != 1 {
		t.Error("no evidence must give the trivial bounds [0,1]")
	}
	if u := WilsonUpper(19, 20, Z95); math.Abs(u-(1-WilsonLower(1, 20, Z95))) > 1e-15 {
		t.Errorf("upper %v", u)
	}
}

func TestValidateNamesSLOAndField(t *testing.T) {
	c := Config{Objectives: []Objective{
		{Name: "a", Target: 1.5},
		{Name: "b", Target: 0.9, Thresholds: Thresholds{Fluidity: 0.9, TTFT: -1}, Scope: Scope{APIs: []string{"embeddings"}, PromptClasses: []string{"huge"}}},
		{Name: "b", Target: 0.9, Thresholds: Thresholds{E2E: time.Second}, Structure: "yes"},
	}}.WithDefaults()
	var got []string
	for _, e := range c.Validate() {
		got = append(got, e.Error())
	}
	want := []string{
		"slo a: target must be in (0,1), got 1.5",
		"slo a: thresholds: at least one is required",
		"slo b: thresholds.ttft must not be negative",
		"slo b: thresholds.fluidity needs fluidity.deadline and fluidity.cadence",
		`slo b: scope.apis: unknown api "embeddings"`,
		`slo b: scope.prompt_classes: no class named "huge"`,
		"slo b: name is used twice",
		`slo b: structure must be "required" or absent, got "yes"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func ExampleWilsonLower() {
	fmt.Printf("%.4f %.4f %.4f\n", WilsonLower(20, 20, Z95), WilsonLower(95, 100, Z95), WilsonLower(0, 50, Z95))
	// Output: 0.8808 0.9008 0.0000
}

// The verdict, classes and stall count reach the record's JSON.
func TestVerdictInRecord(t *testing.T) {
	o := objective()
	o.Thresholds.Fluidity = 0
	j := NewJudge(Config{Objectives: []Objective{o}, StallThreshold: 30 * ms})
	r := rec(record.Success, 1, 100)
	judged(j, r)
	b, _ := r.MarshalJSON()
	want := `"stalls":0,"prompt_class":"short","output_class":"short","slo":[{"name":"chat","qualified":false,"failed":["output_tokens"],"not_applicable":["tpot","max_itl"]}]}`
	if !strings.HasSuffix(string(b), want) {
		t.Fatalf("record JSON\n%s\ndoes not end with\n%s", b, want)
	}
	r = good() // gaps of 40 ms > 30 ms: 4 stalls
	judged(j, r)
	if r.Stalls != 4 {
		t.Fatalf("stalls %d, want 4", r.Stalls)
	}
}
