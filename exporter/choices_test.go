package exporter

import (
	"slices"
	"testing"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// A response with two choices at 60 ms per token each, 30 ms apart: the
// metrics read the same worst-choice TPOT and max ITL as the record and
// the SLO verdict, and the ITL histogram gets each choice's own gaps.
func TestMapTwoChoices(t *testing.T) {
	const ms = time.Millisecond
	r := record.New(8)
	r.Arrive = time.Now()
	r.API, r.Model, r.Traffic, r.Stream, r.Outcome, r.OutputTokens = stream.NameChat, "m", "live", true, record.Success, 8
	r.PromptClass, r.OutputClass = "short", "short"
	r.AddToken(r.Arrive.Add(100*ms), 0, true)
	r.SplitChoices(0)
	r.ChoiceSlot(1)
	for k := range 4 {
		if k > 0 {
			r.AddChoiceToken(0, r.Arrive.Add(time.Duration(100+60*k)*ms), 0, true)
		}
		r.AddChoiceToken(1, r.Arrive.Add(time.Duration(130+60*k)*ms), 0, true)
	}
	r.Terminal = r.Arrive.Add(320 * ms)
	got := map[Instrument][]float64{}
	Map(r, BaseLabels(record.Key{API: r.API, Model: r.Model, Traffic: r.Traffic}), true, func(i Instrument, v float64, _ *Labels) {
		got[i] = append(got[i], v)
	})
	for _, i := range []Instrument{TPOT, TPOTByClass, MaxGap} {
		if !slices.Equal(got[i], []float64{0.06}) {
			t.Errorf("instrument %d: %v, want the worst choice's 0.06 s", i, got[i])
		}
	}
	if !slices.Equal(got[TTFT], []float64{0.1}) {
		t.Errorf("TTFT %v, want the first token of any choice, 0.1 s", got[TTFT])
	}
	if len(got[ITL]) != 6 || slices.Min(got[ITL]) != 0.06 || slices.Max(got[ITL]) != 0.06 {
		t.Errorf("ITL %v, want each choice's six gaps of 0.06 s", got[ITL])
	}
}
