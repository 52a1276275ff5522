package slo

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
)

// The live knee (docs/cost.md): every finished request is counted, per
// SLO, in the bucket of the load it ran under, so that attainment (with
// its Wilson bound) and goodput read as a curve against load; the knee
// is the highest load bucket whose attainment lower bound still meets
// the SLO's target.
//
// The load of a request is the time-weighted mean number of requests in
// flight through the sidecar during its life, itself included: for a
// request alone it is 1, and for one that spent half its life beside 3
// others and half beside 7 it is 6. Why this and not the count at
// arrival: what breaks an SLO at the knee is the batch the request
// shared while it decoded (per-token time grows with occupancy) and the
// queue it waited in, over its whole life; a request that arrived at a
// quiet moment just before a burst ran under the burst. The sidecar
// knows its own in-flight count exactly and at once; the engine's
// tokentap_engine_requests_running is scraped every few seconds, which is
// coarser than most requests' lives, and leaves out the engine's queue.

// Knee states.
const (
	// KneeEstimate: some load bucket meets the target with evidence.
	KneeEstimate = "estimate"
	// KneeNotMet: no bucket meets, and some bucket with evidence is
	// proven below the target: the SLO is missed at every load seen.
	KneeNotMet = "not_met"
	// KneeNotEnoughEvidence: no bucket has the evidence to meet or miss.
	KneeNotEnoughEvidence = "not_enough_evidence"
)

// KneeMinRequests is the fewest offered requests a load bucket needs
// before it counts as evidence, either way (the Wilson bound already
// needs more than this to prove a target of 0.9 or above; the floor
// keeps a lower target from being "proven" by a dozen requests). The
// shipped knee rules use the same number.
const KneeMinRequests = 20

// LoadBuckets are the load buckets: upper bounds, increasing, and an
// implied last, open one (+Inf). Bucket i holds loads in
// (bounds[i-1], bounds[i]].
type LoadBuckets struct {
	bounds []float64
	labels []string // len(bounds)+1; the last is "+Inf"
}

// NewLoadBuckets returns the buckets of the capacity section (valid;
// empty means the defaults).
func NewLoadBuckets(c config.Capacity) LoadBuckets {
	c = c.WithDefaults()
	b := LoadBuckets{bounds: append([]float64{}, c.LoadBuckets...)}
	for _, v := range b.bounds {
		b.labels = append(b.labels, FormatLoad(v))
	}
	b.labels = append(b.labels, "+Inf")
	return b
}

// FormatLoad renders a bucket bound as its label value.
func FormatLoad(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Len is the number of buckets, the open one included.
func (b LoadBuckets) Len() int { return len(b.labels) }

// Index returns the bucket of a load.
func (b LoadBuckets) Index(load float64) int {
	for i, v := range b.bounds {
		if load <= v {
			return i
		}
	}
	return len(b.bounds)
}

// Label returns bucket i's label: its upper bound, or "+Inf".
func (b LoadBuckets) Label(i int) string { return b.labels[i] }

// Labels returns every bucket's label, in order, "+Inf" last: the load
// label values the by-load counters pre-create (exporter.Config).
func (b LoadBuckets) Labels() []string { return append([]string(nil), b.labels...) }

// Upper returns bucket i's upper bound (+Inf for the last).
func (b LoadBuckets) Upper(i int) float64 {
	if i >= len(b.bounds) {
		return math.Inf(1)
	}
	return b.bounds[i]
}

// Lower returns bucket i's lower bound (0 for the first).
func (b LoadBuckets) Lower(i int) float64 {
	if i == 0 {
		return 0
	}
	return b.bounds[i-1]
}

// LoadMeter keeps the number of requests in flight through the sidecar
// and its time integral, so that each request's time-weighted mean load
// costs two short critical sections: one at its start, one at its end
// (never per token).
type LoadMeter struct {
	buckets LoadBuckets
	now     func() time.Time

	mu       sync.Mutex
	epoch    time.Time // the zero of the integral's clock (monotonic)
	last     float64   // ns since epoch of the last change
	n        int64     // requests in flight
	integral float64   // ∫ n dt in request·ns since epoch
}

// NewLoadMeter returns a meter that labels loads with buckets.
func NewLoadMeter(buckets LoadBuckets) *LoadMeter {
	m := &LoadMeter{buckets: buckets, now: time.Now}
	m.epoch = m.now()
	return m
}

// Buckets returns the meter's load buckets.
func (m *LoadMeter) Buckets() LoadBuckets { return m.buckets }

// advance brings the integral to now; m.mu is held.
func (m *LoadMeter) advance() float64 {
	t := float64(m.now().Sub(m.epoch))
	if t > m.last {
		m.integral += float64(m.n) * (t - m.last)
		m.last = t
	}
	return m.last
}

// Begin counts a request in flight from now and returns its mark (ns
// since the meter's epoch, and the integral then), for End.
func (m *LoadMeter) Begin() pipeline.LoadMark {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.advance()
	m.n++
	return pipeline.LoadMark{At: t, Integral: m.integral}
}

// InFlight returns the requests in flight now.
func (m *LoadMeter) InFlight() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// End ends the request begun at s (Begin's mark) and returns its load,
// the time-weighted mean of the in-flight count over its life (itself
// included), and the label of its bucket. A request of no measurable
// duration gets the count at its end. Each Begin takes one End.
func (m *LoadMeter) End(s pipeline.LoadMark) (load float64, bucket string) {
	m.mu.Lock()
	t := m.advance()
	n := m.n
	m.n--
	integral := m.integral
	m.mu.Unlock()
	if t > s.At {
		load = (integral - s.Integral) / (t - s.At)
	} else {
		load = float64(n)
	}
	return load, m.buckets.Label(m.buckets.Index(load))
}

// LoadPoint is one load bucket of an SLO's attainment-vs-load curve.
type LoadPoint struct {
	Bucket            string   `json:"bucket"` // its label: the upper bound, or +Inf
	From              float64  `json:"from"`   // loads in (from, to]
	To                *float64 `json:"to"`     // null for the open bucket
	Offered           int64    `json:"offered"`
	Qualified         int64    `json:"qualified"`
	Attainment        *float64 `json:"attainment"`
	AttainmentLower95 float64  `json:"attainment_lower95"`
	AttainmentUpper95 float64  `json:"attainment_upper95"`
	// State: meets (enough evidence, lower bound ≥ target), missed
	// (enough evidence, upper bound < target), not_proven, or
	// too_few (fewer than KneeMinRequests).
	State             string  `json:"state"`
	GoodputTokensRate float64 `json:"goodput_tokens_per_second"`
}

// Knee is the estimate of the safe capacity: the highest load bucket
// whose attainment lower bound meets the target.
type Knee struct {
	State string `json:"state"` // KneeEstimate, KneeNotMet or KneeNotEnoughEvidence
	// Bucket is the knee's bucket label; Load its upper bound (null for
	// the open bucket: beyond the last bound); Lower95 its attainment
	// lower bound: set for an estimate. Evidence is the knee bucket's
	// offered requests for an estimate, and every bucket's otherwise.
	Bucket   string   `json:"bucket,omitempty"`
	Load     *float64 `json:"load,omitempty"`
	Evidence int64    `json:"evidence_requests"`
	Lower95  float64  `json:"attainment_lower95,omitempty"`
	// Missed is the lowest bucket above the knee (or, with no knee, the
	// lowest bucket) proven below the target: the knee lies under it.
	Missed string `json:"first_missed_bucket,omitempty"`
}

// Curve computes the points of the buckets with requests, from offered,
// qualified and qualified-token counts per bucket over span seconds.
func Curve(b LoadBuckets, offered, qualified, goodTokens []int64, span, target float64) []LoadPoint {
	var pts []LoadPoint
	for i := 0; i < b.Len(); i++ {
		n, k := offered[i], qualified[i]
		if n == 0 {
			continue
		}
		p := LoadPoint{Bucket: b.Label(i), From: b.Lower(i), Offered: n, Qualified: k,
			AttainmentLower95: WilsonLower(float64(k), float64(n), Z95), AttainmentUpper95: WilsonUpper(float64(k), float64(n), Z95)}
		if up := b.Upper(i); !math.IsInf(up, 1) {
			p.To = &up
		}
		a := float64(k) / float64(n)
		p.Attainment = &a
		switch {
		case n < KneeMinRequests:
			p.State = "too_few"
		case p.AttainmentLower95 >= target:
			p.State = "meets"
		case p.AttainmentUpper95 < target:
			p.State = "missed"
		default:
			p.State = "not_proven"
		}
		if span > 0 {
			p.GoodputTokensRate = float64(goodTokens[i]) / span
		}
		pts = append(pts, p)
	}
	return pts
}

// EstimateKnee reads the knee off a curve (increasing load): the highest
// bucket that meets the target; the lowest bucket above it proven below
// the target bounds it.
func EstimateKnee(pts []LoadPoint) Knee {
	k := Knee{State: KneeNotEnoughEvidence}
	knee := -1
	for i, p := range pts {
		if p.State == "meets" {
			knee = i
		}
		k.Evidence += p.Offered
	}
	if knee >= 0 {
		p := pts[knee]
		k.State, k.Bucket, k.Load, k.Evidence, k.Lower95 = KneeEstimate, p.Bucket, p.To, p.Offered, p.AttainmentLower95
	}
	for _, p := range pts[knee+1:] {
		if p.State == "missed" {
			k.Missed = p.Bucket
			if knee < 0 {
				k.State = KneeNotMet
			}
			break
		}
	}
	return k
}
