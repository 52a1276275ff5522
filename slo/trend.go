package slo

import (
	"context"
	"math"
	"time"

	"github.com/tokentap/tokentap/record"
)

// The trend (docs/live.md): the live page's rolling figures over the
// last TrendSpan, one point per resolution interval, from the same
// finished records as /slo (the pipeline's stage 6). Each point is what
// finished in its interval: TTFT p50 and p99 (request-weighted) and ITL
// p99 (gap-weighted) of the streamed requests, from the scorecard's log
// buckets (at most 5% above the exact percentile); per SLO, the
// requests offered and qualified, the attainment with its one-sided 95%
// Wilson lower bound, and the goodput; and the requests in flight
// through the sidecar and the engine's queue, sampled once per interval.

// TrendSpan is how far back the trend reaches.
const TrendSpan = 15 * time.Minute

// Trend resolutions: the bounds of TrendOptions.Resolution.
const (
	MinTrendResolution = time.Second
	MaxTrendResolution = 10 * time.Second
)

// TrendOptions configure a Trend.
type TrendOptions struct {
	// Resolution is the length of one point, within
	// [MinTrendResolution, MaxTrendResolution]; 0 means 5 s, and a
	// value out of bounds is clamped to them.
	Resolution time.Duration
	// InFlight returns the requests in flight through the sidecar
	// (LoadMeter.InFlight); nil: not sampled.
	InFlight func() int64
	// Queue returns the engine's waiting queue as last scraped, and
	// whether it is known; nil: not sampled.
	Queue func() (float64, bool)
	// Clock is the time source; nil means time.Now.
	Clock func() time.Time
}

// Trend keeps the live page's rolling figures. Add is called once per
// finished request (a pipeline Tally), never per token; Run samples the
// in-flight count and the engine queue once per resolution. Safe for
// concurrent use.
type Trend struct {
	objectives []Objective
	o          TrendOptions
	w          sliding[trendSums]
}

type trendSums struct {
	requests  int64
	ttft, itl latHist
	// Per SLO, parallel to the objectives.
	offered, qualified, goodTokens []int64
	inFlight                       int64 // the highest sample; -1: none
	queue                          float64
	queueKnown                     bool
}

// NewTrend returns the trend of cfg's SLOs.
func NewTrend(cfg Config, o TrendOptions) *Trend {
	if o.Resolution == 0 {
		o.Resolution = 5 * time.Second
	}
	o.Resolution = min(max(o.Resolution, MinTrendResolution), MaxTrendResolution)
	if o.Clock == nil {
		o.Clock = time.Now
	}
	t := &Trend{objectives: cfg.Objectives, o: o}
	t.w.init(TrendSpan, int(TrendSpan/o.Resolution))
	return t
}

// Resolution is the length of one point.
func (t *Trend) Resolution() time.Duration { return t.o.Resolution }

func (t *Trend) fresh(s *trendSums) {
	if s.offered == nil {
		n := len(t.objectives)
		s.offered, s.qualified, s.goodTokens = make([]int64, n), make([]int64, n), make([]int64, n)
		s.inFlight = -1
	}
}

// Add counts a finished record in the interval it finished in.
func (t *Trend) Add(r *record.Record) {
	t.w.add(t.o.Clock(), func(s *trendSums) {
		t.fresh(s)
		s.requests++
		if r.Stream {
			if d, ok := r.TTFT(); ok {
				s.ttft.add(d.Seconds())
			}
			r.Gaps(func(g time.Duration) { s.itl.add(g.Seconds()) })
		}
		for i, o := range t.objectives {
			for k := range r.SLO {
				v := &r.SLO[k]
				if v.Name != o.Name || v.Excluded {
					continue
				}
				s.offered[i]++
				if v.Qualified {
					s.qualified[i]++
					s.goodTokens[i] += max(r.OutputTokens, 0)
				}
			}
		}
	})
}

// Sample records the in-flight count and the engine queue now.
func (t *Trend) Sample() {
	var n int64 = -1
	if t.o.InFlight != nil {
		n = t.o.InFlight()
	}
	var q float64
	var known bool
	if t.o.Queue != nil {
		q, known = t.o.Queue()
	}
	t.w.add(t.o.Clock(), func(s *trendSums) {
		t.fresh(s)
		s.inFlight = max(s.inFlight, n)
		if known {
			s.queue, s.queueKnown = q, true
		}
	})
}

// Run calls Sample once per resolution until ctx is done.
func (t *Trend) Run(ctx context.Context) {
	tick := time.NewTicker(t.o.Resolution)
	defer tick.Stop()
	for {
		t.Sample()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// TrendDoc is the trend as the live page reads it (/live/data).
type TrendDoc struct {
	ResolutionSeconds float64      `json:"resolution_seconds"`
	SpanSeconds       float64      `json:"span_seconds"`
	SLOs              []TrendSLO   `json:"slos"`
	Points            []TrendPoint `json:"points"`
}

// TrendSLO names one SLO of the trend's points.
type TrendSLO struct {
	Name   string  `json:"name"`
	Target float64 `json:"target"`
}

// TrendPoint is one interval. A null figure had nothing to measure in
// the interval.
type TrendPoint struct {
	// Start is the interval's start; it covers [start, start+resolution).
	Start    time.Time `json:"start"`
	Requests int64     `json:"requests"`
	TTFTP50  *float64  `json:"ttft_p50_seconds"`
	TTFTP99  *float64  `json:"ttft_p99_seconds"`
	ITLP99   *float64  `json:"itl_p99_seconds"`
	// SLOs is parallel to TrendDoc.SLOs.
	SLOs []TrendSLOPoint `json:"slos"`
	// InFlight is the most requests in flight sampled in the interval;
	// EngineQueue the engine's waiting queue as last scraped.
	InFlight    *int64   `json:"in_flight"`
	EngineQueue *float64 `json:"engine_queue"`
}

// TrendSLOPoint is one SLO in one interval.
type TrendSLOPoint struct {
	Offered           int64    `json:"offered"`
	Qualified         int64    `json:"qualified"`
	Attainment        *float64 `json:"attainment"`
	AttainmentLower95 float64  `json:"attainment_lower95"`
	GoodputTokensRate float64  `json:"goodput_tokens_per_second"`
}

// Doc returns the points of the last TrendSpan, oldest first; intervals
// with nothing counted or sampled are left out.
func (t *Trend) Doc() TrendDoc {
	d := TrendDoc{ResolutionSeconds: t.o.Resolution.Seconds(), SpanSeconds: TrendSpan.Seconds(), SLOs: []TrendSLO{}, Points: []TrendPoint{}}
	for _, o := range t.objectives {
		d.SLOs = append(d.SLOs, TrendSLO{Name: o.Name, Target: o.Target})
	}
	res := t.o.Resolution.Seconds()
	t.w.each(t.o.Clock(), func(start time.Time, s *trendSums) {
		p := TrendPoint{Start: start.UTC(), Requests: s.requests, SLOs: []TrendSLOPoint{},
			TTFTP50: s.ttft.quantile(0.5), TTFTP99: s.ttft.quantile(0.99), ITLP99: s.itl.quantile(0.99)}
		for i := range s.offered {
			n, k := s.offered[i], s.qualified[i]
			sp := TrendSLOPoint{Offered: n, Qualified: k, AttainmentLower95: WilsonLower(float64(k), float64(n), Z95),
				GoodputTokensRate: float64(s.goodTokens[i]) / res}
			if n > 0 {
				a := float64(k) / float64(n)
				sp.Attainment = &a
			}
			p.SLOs = append(p.SLOs, sp)
		}
		if s.inFlight >= 0 {
			n := s.inFlight
			p.InFlight = &n
		}
		if s.queueKnown && !math.IsNaN(s.queue) {
			q := s.queue
			p.EngineQueue = &q
		}
		d.Points = append(d.Points, p)
	})
	return d
}
