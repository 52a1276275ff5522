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
}

// Status computes every SLO's status at now.
func (b *Book) Status(now time.Time) Page {
	p := Page{Scope: "this sidecar instance only, over its own sliding window; fleet-wide attainment comes from Prometheus (slo:tokentap_* recording rules)", Generated: now.UTC()}
	for i, o := range b.cfg.Objectives {
		off, qual, tok, fails, span := b.windows[i].Totals(now)
		s := Status{Name: o.Name, Target: o.Target, WindowSeconds: o.Window.Seconds(), SpanSeconds: span.Seconds(),
			Offered: off, Qualified: qual, TopFailures: []Reason{}}
		s.AttainmentLower95 = WilsonLower(float64(qual), float64(off), Z95)
		s.AttainmentUpper95 = WilsonUpper(float64(qual), float64(off), Z95)
		if off > 0 {
			a := float64(qual) / float64(off)
			s.Attainment = &a
			s.FastInvalid = b.windows[i].FastInvalid(now)
			fi := float64(s.FastInvalid) / float64(off)
			s.FastInvalidShare = &fi
		}
		switch {
		case off > 0 && s.AttainmentLower95 >= o.Target:
			s.Verdict = "met"
		case off > 0 && s.AttainmentUpper95 < o.Target:
			s.Verdict = "missed"
		default:
			s.Verdict = "not_proven"
		}
		if secs := rateSpan(span.Seconds()); off > 0 {
			s.GoodputRequestsRate = float64(qual) / secs
			s.GoodputTokensRate = float64(tok) / secs
		}
		for k, v := range fails {
			s.TopFailures = append(s.TopFailures, Reason{k, v})
		}
		sort.Slice(s.TopFailures, func(a, b int) bool {
			fa, fb := s.TopFailures[a], s.TopFailures[b]
			return fa.Count > fb.Count || (fa.Count == fb.Count && fa.Reason < fb.Reason)
		})
		if len(s.TopFailures) > 5 {
			s.TopFailures = s.TopFailures[:5]
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
{{template "scorecards" .}}</body></html>`))

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
