package replay

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/slo"
)

// Quantiles are a latency's p50, p99 and largest value over N requests
// (or gaps); all zero when N is 0. p50 and p99 read at most 1% high.
type Quantiles struct {
	N             int64
	P50, P99, Max time.Duration
}

func quantiles(h *hist) Quantiles {
	q := Quantiles{N: h.n, Max: h.max}
	q.P50, _ = h.quantile(0.50)
	q.P99, _ = h.quantile(0.99)
	return q
}

// SLOStep is one SLO over one step (docs/slo.md: attainment, its
// one-sided 95% Wilson bounds, the verdict).
type SLOStep struct {
	Name                string
	Target              float64
	Offered, Qualified  int64
	Attainment          float64 // 0 when nothing was offered
	Lower95, Upper95    float64
	Verdict             string // met, missed, not_proven
	GoodputRequestsRate float64
	GoodputTokensRate   float64
	// ProdJudged and ProdMet are the trace's own verdicts of the
	// requests replayed (tokentap captures); 0 for public traces.
	ProdJudged, ProdMet int64
}

// Step is what one step of a replay measured.
type Step struct {
	// Rate is the arrival-rate multiplier; ArrivalRate the requests per
	// second it scheduled (0 for fewer than 2 requests).
	Rate, ArrivalRate float64
	// FirstLine and LastLine are the trace lines it scheduled;
	// StoppedBy why it stopped before the trace's end ("duration",
	// "shutdown", "error"), "" at the end.
	FirstLine, LastLine int64
	StoppedBy           string
	// Scheduled = Sent + the NotSent counts; Sent = Answered + the
	// Failed counts (by outcome/error type): every request accounted.
	Scheduled, Sent, Answered int64
	NotSent, Failed           map[string]int64
	// LengthChecked answered requests had an output_length and a count;
	// LengthMismatch of them had another count (MismatchLines: the
	// first few); LengthUnknown answered requests had no count.
	LengthChecked, LengthMismatch, LengthUnknown int64
	MismatchLines                                []int64
	// Lag is the schedule lag: sent − scheduled.
	Lag                Quantiles
	TTFT, TPOT, ITL    Quantiles
	E2E                Quantiles
	ProdTTFT, ProdTPOT Quantiles // the trace's own latencies, when it has them
	ProdE2E            Quantiles
	OutputTokens       int64
	SpanSeconds        float64 // first send to last end
	SLOs               []SLOStep
}

// Knee is an SLO's knee over a curve of buckets: of arrival rate
// (Report.RateKnees, the buckets being the rate multipliers) or of load
// (Report.LoadKnees; docs/cost.md, "The knee").
type Knee struct {
	SLO   string
	Curve []slo.LoadPoint
	Knee  slo.Knee
}

// Report is a whole replay's result.
type Report struct {
	Steps []Step
	// BaseRate is the trace's own arrival rate at --time-scale, in
	// requests per second (the rate of multiplier 1).
	BaseRate  float64
	RateKnees []Knee // with more than one step
	LoadKnees []Knee
	// Seed is the seed the prompt text was drawn with (Options.Seed, or
	// the one drawn for it): --seed with it sends the same text again.
	Seed uint64
}

func verdict(lower, upper, target float64, n int64) string {
	switch {
	case n > 0 && lower >= target:
		return "met"
	case n > 0 && upper < target:
		return "missed"
	}
	return "not_proven"
}

func (r *Runner) report(steps []*tally) *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := &Report{Seed: r.opts.Seed}
	for _, t := range steps {
		s := Step{Rate: t.rate, FirstLine: t.firstLine, LastLine: t.lastLine, StoppedBy: t.stoppedBy,
			Scheduled: t.scheduled, Sent: t.sent, Answered: t.answered, NotSent: t.notSent, Failed: t.failed,
			LengthChecked: t.lengthChecked, LengthMismatch: t.lengthMismatch, LengthUnknown: t.lengthUnknown, MismatchLines: t.lengthMismatchExamples,
			Lag: quantiles(&t.lag), TTFT: quantiles(&t.ttft), TPOT: quantiles(&t.tpot), ITL: quantiles(&t.itl), E2E: quantiles(&t.e2e),
			ProdTTFT: quantiles(&t.prodTTFT), ProdTPOT: quantiles(&t.prodTPOT), ProdE2E: quantiles(&t.prodE2E), OutputTokens: t.outputTokens}
		if t.scheduled > 1 && t.scheduledSpan > 0 {
			s.ArrivalRate = float64(t.scheduled-1) / t.scheduledSpan.Seconds()
			if rep.BaseRate == 0 {
				rep.BaseRate = s.ArrivalRate / t.rate
			}
		}
		if !t.first.IsZero() && t.last.After(t.first) {
			s.SpanSeconds = t.last.Sub(t.first).Seconds()
		}
		span := max(s.SpanSeconds, 1) // as /slo: rates over at least a second
		for i, st := range t.slo {
			lo := slo.WilsonLower(float64(st.qualified), float64(st.offered), slo.Z95)
			hi := slo.WilsonUpper(float64(st.qualified), float64(st.offered), slo.Z95)
			x := SLOStep{Name: r.names[i], Target: r.targets[i], Offered: st.offered, Qualified: st.qualified, Lower95: lo, Upper95: hi,
				Verdict: verdict(lo, hi, r.targets[i], st.offered), ProdJudged: st.prodJudged, ProdMet: st.prodMet}
			if st.offered > 0 {
				x.Attainment = float64(st.qualified) / float64(st.offered)
				x.GoodputRequestsRate, x.GoodputTokensRate = float64(st.qualified)/span, float64(st.goodTokens)/span
			}
			s.SLOs = append(s.SLOs, x)
		}
		rep.Steps = append(rep.Steps, s)
	}
	if len(steps) > 1 {
		var rates []float64
		for _, t := range steps {
			rates = append(rates, t.rate)
		}
		b := slo.NewLoadBuckets(config.Capacity{LoadBuckets: rates})
		for i, name := range r.names {
			off, qual, good := make([]int64, b.Len()), make([]int64, b.Len()), make([]int64, b.Len())
			for k, t := range steps {
				off[k], qual[k], good[k] = t.slo[i].offered, t.slo[i].qualified, t.slo[i].goodTokens
			}
			c := slo.Curve(b, off, qual, good, 0, r.targets[i])
			rep.RateKnees = append(rep.RateKnees, Knee{SLO: name, Curve: c, Knee: slo.EstimateKnee(c)})
		}
	}
	for i, name := range r.names {
		var span float64
		for _, s := range rep.Steps {
			span += s.SpanSeconds
		}
		c := slo.Curve(r.buckets, r.byLoad[i][0], r.byLoad[i][1], r.byLoad[i][2], span, r.targets[i])
		rep.LoadKnees = append(rep.LoadKnees, Knee{SLO: name, Curve: c, Knee: slo.EstimateKnee(c)})
	}
	return rep
}

func msq(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func fmtQ(q Quantiles) string {
	if q.N == 0 {
		return "–"
	}
	return fmt.Sprintf("p50 %s  p99 %s  max %s ms  (n=%d)", msq(q.P50), msq(q.P99), msq(q.Max), q.N)
}

func fmtCounts(m map[string]int64) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	var n int64
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		n += m[k]
	}
	return fmt.Sprintf("%d (%s)", n, strings.Join(parts, ", "))
}

// Print writes the report for people (docs/capture.md, "Replay", "The report").
func (rep *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "tokentap replay report (traffic=replay; definitions: docs/capture.md#the-report)\n")
	if rep.BaseRate > 0 {
		fmt.Fprintf(w, "trace arrival rate at rate 1: %.3g req/s\n", rep.BaseRate)
	}
	fmt.Fprintf(w, "prompt text seed: %d (--seed %d sends the same text)\n", rep.Seed, rep.Seed)
	for _, s := range rep.Steps {
		fmt.Fprintf(w, "\n== rate ×%g: %.3g req/s scheduled, trace lines %d-%d", s.Rate, s.ArrivalRate, s.FirstLine, s.LastLine)
		if s.StoppedBy != "" {
			fmt.Fprintf(w, " (stopped by %s)", s.StoppedBy)
		}
		fmt.Fprintf(w, "\n  requests: scheduled %d = sent %d + not sent %s\n", s.Scheduled, s.Sent, fmtCounts(s.NotSent))
		fmt.Fprintf(w, "            sent %d = answered %d + failed %s\n", s.Sent, s.Answered, fmtCounts(s.Failed))
		fmt.Fprintf(w, "  output lengths: %d of %d checked equal output_length", s.LengthChecked-s.LengthMismatch, s.LengthChecked)
		if s.LengthMismatch > 0 {
			fmt.Fprintf(w, " (%d differ, e.g. lines %v)", s.LengthMismatch, s.MismatchLines)
		}
		if s.LengthUnknown > 0 {
			fmt.Fprintf(w, "; %d answers without a count", s.LengthUnknown)
		}
		fmt.Fprintf(w, "\n  schedule lag (sent − scheduled): %s\n", fmtQ(s.Lag))
		fmt.Fprintf(w, "  %-5s replay      %s\n", "TTFT", fmtQ(s.TTFT))
		if s.ProdTTFT.N > 0 {
			fmt.Fprintf(w, "  %-5s production  %s\n", "", fmtQ(s.ProdTTFT))
		}
		fmt.Fprintf(w, "  %-5s replay      %s\n", "TPOT", fmtQ(s.TPOT))
		if s.ProdTPOT.N > 0 {
			fmt.Fprintf(w, "  %-5s production  %s\n", "", fmtQ(s.ProdTPOT))
		}
		fmt.Fprintf(w, "  %-5s replay      %s\n", "ITL", fmtQ(s.ITL))
		fmt.Fprintf(w, "  %-5s replay      %s\n", "E2E", fmtQ(s.E2E))
		if s.ProdE2E.N > 0 {
			fmt.Fprintf(w, "  %-5s production  %s\n", "", fmtQ(s.ProdE2E))
		}
		for _, o := range s.SLOs {
			fmt.Fprintf(w, "  SLO %s: %d of %d qualified = %.2f%%, 95%% bounds [%.2f%%, %.2f%%] vs target %.2f%%: %s; goodput %.3g req/s, %.4g tok/s",
				o.Name, o.Qualified, o.Offered, 100*o.Attainment, 100*o.Lower95, 100*o.Upper95, 100*o.Target, o.Verdict, o.GoodputRequestsRate, o.GoodputTokensRate)
			if o.ProdJudged > 0 {
				fmt.Fprintf(w, "; production %d of %d met = %.2f%%", o.ProdMet, o.ProdJudged, 100*float64(o.ProdMet)/float64(o.ProdJudged))
			}
			fmt.Fprintln(w)
		}
	}
	printKnees := func(title, unit string, ks []Knee, value func(slo.LoadPoint) string) {
		for _, k := range ks {
			fmt.Fprintf(w, "\n%s, SLO %s: %s", title, k.SLO, k.Knee.State)
			switch k.Knee.State {
			case slo.KneeEstimate:
				fmt.Fprintf(w, ": %s %s (lower bound %.2f%%, %d requests)", unit, k.Knee.Bucket, 100*k.Knee.Lower95, k.Knee.Evidence)
			}
			if k.Knee.Missed != "" {
				fmt.Fprintf(w, "; first proven missed: %s %s", unit, k.Knee.Missed)
			}
			fmt.Fprintln(w)
			for _, p := range k.Curve {
				fmt.Fprintf(w, "  %-14s %5d offered, %5d qualified, bounds [%.2f%%, %.2f%%]: %s\n", value(p), p.Offered, p.Qualified,
					100*p.AttainmentLower95, 100*p.AttainmentUpper95, p.State)
			}
		}
	}
	printKnees("knee in arrival rate", "rate ×", rep.RateKnees, func(p slo.LoadPoint) string {
		if p.To == nil {
			return "rate ×" + p.Bucket
		}
		return fmt.Sprintf("×%s %.3g/s", p.Bucket, *p.To*rep.BaseRate)
	})
	printKnees("knee by load bucket", "load ≤", rep.LoadKnees, func(p slo.LoadPoint) string {
		if p.To == nil {
			return fmt.Sprintf("load > %g", p.From)
		}
		return fmt.Sprintf("load (%g, %g]", p.From, *p.To)
	})
}
