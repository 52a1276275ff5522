package slo

import (
	"html/template"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Status is one SLO's state over this instance's sliding window.
type Status struct {
	Name                string   `json:"name"`
	Target              float64  `json:"target"`
	WindowSeconds       float64  `json:"window_seconds"`
	SpanSeconds         float64  `json:"span_seconds"` // the time the counts cover: from the first request counted to now
	Offered             int64    `json:"offered"`
	Qualified           int64    `json:"qualified"`
	Attainment          *float64 `json:"attainment"`         // null with no requests
	AttainmentLower95   float64  `json:"attainment_lower95"` // one-sided 95% Wilson lower bound
	AttainmentUpper95   float64  `json:"attainment_upper95"` // one-sided 95% Wilson upper bound
	Verdict             string   `json:"verdict"`            // met, missed or not_proven
	GoodputRequestsRate float64  `json:"goodput_requests_per_second"`
	GoodputTokensRate   float64  `json:"goodput_tokens_per_second"`
	TopFailures         []Reason `json:"top_failures"`
	// FastInvalid counts the verdicts that failed on structure checks
	// alone (slo.FastInvalid): answers on time that do not hold as
	// structure; FastInvalidShare is their share of Offered (null with
	// no requests).
	FastInvalid      int64    `json:"fast_invalid"`
	FastInvalidShare *float64 `json:"fast_invalid_share"`
	// Scorecard: cost, energy, latency tail and knee over the same
	// window (scorecard.go); null when served without one.
	Scorecard *Card `json:"scorecard,omitempty"`
	// Tenants is the SLO's row again per tenant label, over the same
	// window (docs/slo.md, per tenant), by label; absent when tenants
	// are off or no request of the window had one.
	Tenants []TenantStatus `json:"tenants,omitempty"`
}

// TenantStatus is one tenant's share of an SLO's row: its requests'
// verdicts over the SLO's window.
type TenantStatus struct {
	Tenant              string   `json:"tenant"`
	SpanSeconds         float64  `json:"span_seconds"`
	Offered             int64    `json:"offered"`
	Qualified           int64    `json:"qualified"`
	Attainment          *float64 `json:"attainment"`
	AttainmentLower95   float64  `json:"attainment_lower95"`
	AttainmentUpper95   float64  `json:"attainment_upper95"`
	Verdict             string   `json:"verdict"`
	GoodputRequestsRate float64  `json:"goodput_requests_per_second"`
	GoodputTokensRate   float64  `json:"goodput_tokens_per_second"`
	TopFailures         []Reason `json:"top_failures"`
}

// figures are a window's counts and what is derived from them, as a
// row of /slo shows them.
type figures struct {
	offered, qualified       int64
	attainment               *float64
	lower, upper             float64
	verdict                  string
	goodputReqs, goodputToks float64
	top                      []Reason
	span                     time.Duration
}

// figuresOf computes w's figures at now against target.
func figuresOf(w *Window, now time.Time, target float64) figures {
	off, qual, tok, fails, span := w.Totals(now)
	f := figures{offered: off, qualified: qual, span: span, top: []Reason{}}
	f.lower = WilsonLower(float64(qual), float64(off), Z95)
	f.upper = WilsonUpper(float64(qual), float64(off), Z95)
	if off > 0 {
		a := float64(qual) / float64(off)
		f.attainment = &a
	}
	switch {
	case off > 0 && f.lower >= target:
		f.verdict = "met"
	case off > 0 && f.upper < target:
		f.verdict = "missed"
	default:
		f.verdict = "not_proven"
	}
	if secs := rateSpan(span.Seconds()); off > 0 {
		f.goodputReqs = float64(qual) / secs
		f.goodputToks = float64(tok) / secs
	}
	for k, v := range fails {
		f.top = append(f.top, Reason{k, v})
	}
	sort.Slice(f.top, func(a, b int) bool {
		fa, fb := f.top[a], f.top[b]
		return fa.Count > fb.Count || (fa.Count == fb.Count && fa.Reason < fb.Reason)
	})
	if len(f.top) > 5 {
		f.top = f.top[:5]
	}
	return f
}

// Reason is a failure reason and its count.
type Reason struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// Page is the /slo document.
type Page struct {
	Scope     string    `json:"scope"`
	Generated time.Time `json:"generated"`
	// Synthetic says what on the page is made up (Scorecard.SetSynthetic:
	// the simulator's numbers, a demo SLO or price); absent when nothing
	// is.
	Synthetic string   `json:"synthetic,omitempty"`
	SLOs      []Status `json:"slos"`
	// PrefixReuse is the live prefix reuse (prefix.go); absent when the
	// reuse is off.
	PrefixReuse *PrefixReuse `json:"prefix_reuse,omitempty"`
}

// Status computes every SLO's status at now.
func (b *Book) Status(now time.Time) Page {
	p := Page{Scope: "this sidecar instance only, over its own sliding window; fleet-wide attainment comes from Prometheus (slo:tokentap_* recording rules)", Generated: now.UTC()}
	for i, o := range b.cfg.Objectives {
		f := figuresOf(b.windows[i], now, o.Target)
		s := Status{Name: o.Name, Target: o.Target, WindowSeconds: o.Window.Seconds(), SpanSeconds: f.span.Seconds(),
			Offered: f.offered, Qualified: f.qualified, Attainment: f.attainment, AttainmentLower95: f.lower, AttainmentUpper95: f.upper,
			Verdict: f.verdict, GoodputRequestsRate: f.goodputReqs, GoodputTokensRate: f.goodputToks, TopFailures: f.top}
		if f.offered > 0 {
			s.FastInvalid = b.windows[i].FastInvalid(now)
			fi := float64(s.FastInvalid) / float64(f.offered)
			s.FastInvalidShare = &fi
		}
		names, ws := b.tenantWindows(i)
		for k, w := range ws {
			tf := figuresOf(w, now, o.Target)
			if tf.offered == 0 {
				continue // its requests left the window
			}
			s.Tenants = append(s.Tenants, TenantStatus{Tenant: names[k], SpanSeconds: tf.span.Seconds(), Offered: tf.offered, Qualified: tf.qualified,
				Attainment: tf.attainment, AttainmentLower95: tf.lower, AttainmentUpper95: tf.upper, Verdict: tf.verdict,
				GoodputRequestsRate: tf.goodputReqs, GoodputTokensRate: tf.goodputToks, TopFailures: tf.top})
		}
		p.SLOs = append(p.SLOs, s)
	}
	return p
}

var pageHTML = template.Must(template.New("slo").Funcs(template.FuncMap{
	"pct":   func(f float64) string { return fmtFloat(f*100) + "%" },
	"num":   fmtFloat,
	"deref": func(f *float64) float64 { return *f },
}).Parse(`<!doctype html><html><head><meta charset="utf-8"><title>tokentap SLOs</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#eee}.met{color:#070}.missed{color:#b00}.synthetic{background:#fff3b0;border:2px solid #d9a400;padding:.5em 1em;font-weight:bold}</style><link rel="icon" href="data:,"></head><body>
{{if .Synthetic}}<div class="synthetic" id="synthetic">SYNTHETIC: {{.Synthetic}}</div>{{end}}
<h1>SLO attainment: this instance's view</h1><p><a href="/">index</a> · <a href="/live">live</a> · <a href="/probes">/probes</a></p><p>{{.Scope}}. Generated {{.Generated.Format "2006-01-02T15:04:05Z07:00"}}. <a href="?format=json">JSON</a></p>
<table><tr><th>SLO</th><th>target</th><th>window</th><th>offered</th><th>qualified</th><th>attainment</th><th>95% bounds</th><th>verdict</th><th>goodput req/s</th><th>goodput tok/s</th><th>fast but invalid</th><th>top failures</th></tr>
{{range .SLOs}}<tr><td style="text-align:left">{{.Name}}</td><td>{{pct .Target}}</td><td>{{num .WindowSeconds}} s</td><td>{{.Offered}}</td><td>{{.Qualified}}</td>
<td>{{if .Attainment}}{{pct (deref .Attainment)}}{{else}}–{{end}}</td><td>{{pct .AttainmentLower95}} – {{pct .AttainmentUpper95}}</td>
<td class="{{.Verdict}}">{{.Verdict}}</td><td>{{num .GoodputRequestsRate}}</td><td>{{num .GoodputTokensRate}}</td>
<td>{{if .FastInvalidShare}}{{.FastInvalid}} ({{pct (deref .FastInvalidShare)}}){{else}}–{{end}}</td>
<td style="text-align:left">{{range .TopFailures}}{{.Reason}}: {{.Count}} {{end}}</td></tr>{{end}}</table>
<p>met: the 95% lower bound is at or above target; missed: the 95% upper bound is below target; not_proven: the evidence does not decide.</p>
{{range .SLOs}}{{if .Tenants}}<h2 id="tenants-{{.Name}}">{{.Name}} by tenant</h2>
<p>Each tenant's requests of the same window (tenant: a declared name, t- and 12 hex characters of a keyed hash, _other past max_tenants, _none without an identity).</p>
<table class="tenants"><tr><th>tenant</th><th>offered</th><th>qualified</th><th>attainment</th><th>95% bounds</th><th>verdict</th><th>goodput req/s</th><th>goodput tok/s</th><th>top failures</th></tr>
{{range .Tenants}}<tr><td style="text-align:left">{{.Tenant}}</td><td>{{.Offered}}</td><td>{{.Qualified}}</td>
<td>{{if .Attainment}}{{pct (deref .Attainment)}}{{else}}–{{end}}</td><td>{{pct .AttainmentLower95}} – {{pct .AttainmentUpper95}}</td>
<td class="{{.Verdict}}">{{.Verdict}}</td><td>{{num .GoodputRequestsRate}}</td><td>{{num .GoodputTokensRate}}</td>
<td style="text-align:left">{{range .TopFailures}}{{.Reason}}: {{.Count}} {{end}}</td></tr>{{end}}</table>{{end}}{{end}}
{{template "scorecards" .}}
{{template "prefix" .}}</body></html>`))

// minRateSpan is the least span, in seconds, that a rate on /slo is
// divided by: a handful of requests a few milliseconds apart would
// otherwise read as thousands per second (3 requests of 4 tokens in
// 2.6 ms: 12 tok/s, not 4,615).
const minRateSpan = 1.0

// rateSpan is the span in seconds that every /slo rate (the row's and
// the scorecard's, and the scorecard's cost over the span) divides by:
// the time the counts cover, at least minRateSpan (1 for a zero or
// negative span).
func rateSpan(seconds float64) float64 { return math.Max(seconds, minRateSpan) }

func fmtFloat(f float64) string {
	return strings.TrimRight(strings.TrimRight(strconvFormat(f), "0"), ".")
}

func strconvFormat(f float64) string { return strconv.FormatFloat(f, 'f', 4, 64) }
