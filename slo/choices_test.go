package slo

import (
	"slices"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
)

// twoChoices is a finished n = 2 stream: each choice a token every 60 ms,
// the second 30 ms after the first (choice 0 at 100, 160, 220, 280 ms;
// choice 1 at 130, 190, 250, 310 ms), 8 tokens by usage.
func twoChoices() *record.Record {
	r := rec(record.Success, 8)
	r.AddToken(r.Arrive.Add(100*ms), 0, true)
	r.SplitChoices(0)
	r.ChoiceSlot(1)
	for k := range 4 {
		if k > 0 {
			r.AddChoiceToken(0, r.Arrive.Add(time.Duration(100+60*k)*ms), 0, true)
		}
		r.AddChoiceToken(1, r.Arrive.Add(time.Duration(130+60*k)*ms), 0, true)
	}
	r.SetChoiceFinish(0, []byte("stop"))
	r.SetChoiceFinish(1, []byte("stop"))
	r.Terminal = r.Arrive.Add(311 * ms)
	return r
}

// The judge reads the worst choice: TPOT and max ITL 60 ms fail 50 ms
// thresholds (pooled, the events came every 30 ms); stalls are gaps of
// one choice; fluidity is the worst choice's.
//
// Fluidity, deadline 150 ms, cadence 40 ms. Choice 0 (100, 160, 220,
// 280): due 150, 190, 230, 270; 280 is late by one deadline: 1 miss in
// 4, 0.75. Choice 1 (130, 190, 250, 310): 250 misses 230, the schedule
// restarts (due 290), 310 misses it: 2 in 4, 0.5. Pooled, every token
// was on time: 1.
func TestJudgeReadsTheWorstChoice(t *testing.T) {
	r := twoChoices()
	o := Objective{Name: "chat", Target: 0.9, Thresholds: Thresholds{TTFT: 120 * ms, TPOT: 50 * ms, MaxITL: 50 * ms, Fluidity: 0.6},
		Fluidity: FluiditySchedule{Deadline: 150 * ms, Cadence: 40 * ms}}
	v := judge(o, r)
	if v.Qualified || !slices.Equal(v.Failed, []string{TPOT, MaxITL, Fluidity}) || v.Fluidity == nil || *v.Fluidity != 0.5 {
		t.Errorf("verdict %+v (fluidity %v), want tpot, max_itl and fluidity 0.5 failed, TTFT 100 ms met", v, deref(v.Fluidity))
	}
	o.Thresholds = Thresholds{TPOT: 60 * ms, MaxITL: 60 * ms}
	if v := judge(o, r); !v.Qualified {
		t.Errorf("at 60 ms: %+v", v)
	}
	j := NewJudge(Config{StallThreshold: 50 * ms})
	if got := j.Judge(r).Stalls; got != 6 {
		t.Errorf("%d stalls above 50 ms, want each choice's 3 gaps of 60 ms", got)
	}
}

// Two choices of one token each: no gap, so max ITL and TPOT do not
// apply, as for a one-token answer.
func TestOneTokenChoicesHaveNoGap(t *testing.T) {
	r := rec(record.Success, 2)
	r.AddToken(r.Arrive.Add(100*ms), 0, true)
	r.SplitChoices(0)
	r.ChoiceSlot(1)
	r.AddChoiceToken(1, r.Arrive.Add(400*ms), 0, true)
	o := Objective{Name: "chat", Target: 0.9, Thresholds: Thresholds{TPOT: 50 * ms, MaxITL: 50 * ms}}
	if v := judge(o, r); !v.Qualified || !slices.Equal(v.NotApplicable, []string{TPOT, MaxITL}) {
		t.Errorf("verdict %+v, want tpot and max_itl not applicable", v)
	}
}
