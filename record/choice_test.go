package record

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Two choices at 60 ms per token each, interleaved 30 ms apart: pooled
// they would read 30 ms per token; each choice is timed on its own, and
// the request's TPOT and max ITL are the worst choice's.
func TestChoicesTimedOneByOne(t *testing.T) {
	base := time.Unix(1000, 0)
	r := New(8)
	r.Arrive, r.Stream, r.OutputTokens = base, true, 8
	r.AddToken(at(base, 100), 0, true) // choice 0, first
	r.SplitChoices(0)                  // the second index appears
	ms := []float64{130, 160, 190, 220, 250, 280, 340}
	for i, m := range ms {
		index := int64((i + 1) % 2)
		slot, ok := r.ChoiceSlot(index)
		if !ok || r.Choices[slot].Index != index {
			t.Fatalf("slot %d %v for index %d", slot, ok, index)
		}
		r.AddChoiceToken(uint8(slot), at(base, m), 0, true)
	}
	// choice 0: 100, 160, 220, 280: TPOT 60 ms; choice 1: 130, 190, 250, 340: TPOT 70 ms, max gap 90 ms.
	if d, ok := r.TPOT(); !ok || d != 70*msec {
		t.Errorf("TPOT %v %v, want the worst choice's 70 ms", d, ok)
	}
	if d, ok := r.Choices[0].TPOT(); !ok || d != 60*msec {
		t.Errorf("choice 0 TPOT %v %v, want 60 ms", d, ok)
	}
	if d, ok := r.MaxITL(); !ok || d != 90*msec {
		t.Errorf("max ITL %v %v, want 90 ms", d, ok)
	}
	if d, ok := r.TTFT(); !ok || d != 100*msec {
		t.Errorf("TTFT %v, want the first token of any choice, 100 ms", d)
	}
	var gaps []time.Duration
	r.Gaps(func(g time.Duration) { gaps = append(gaps, g) })
	want := []time.Duration{60 * msec, 60 * msec, 60 * msec, 60 * msec, 60 * msec, 90 * msec}
	if len(gaps) != len(want) {
		t.Fatalf("gaps %v, want %v", gaps, want)
	}
	for i := range want {
		if gaps[i] != want[i] {
			t.Fatalf("gaps %v, want %v", gaps, want)
		}
	}
	r.SetChoiceFinish(1, []byte("length"))
	r.SetChoiceFinish(0, []byte("stop"))
	if got := strings.Join(r.FinishReasons(), ","); got != "stop,length" || r.FinishReason != "stop" {
		t.Errorf("finish reasons %q, record's %q", got, r.FinishReason)
	}
	b, err := r.MarshalJSON()
	if err != nil || !json.Valid(b) {
		t.Fatalf("invalid JSON %v: %s", err, b)
	}
	const choices = `"max_itl_ms":90,"choices":[{"index":0,"ttft_ms":100,"tpot_ms":60,"max_itl_ms":60,"token_events":4,"output_tokens":4,"finish_reason":"stop"},` +
		`{"index":1,"ttft_ms":130,"tpot_ms":70,"max_itl_ms":90,"token_events":4,"output_tokens":4,"finish_reason":"length"}]`
	if !strings.Contains(string(b), choices) {
		t.Errorf("JSON lacks %s:\n%s", choices, b)
	}
}

// Per-event token counts count each choice's tokens when every one of
// its events carried one; a choice with no token event has no count, no
// TTFT and no TPOT.
func TestChoiceTokenCounts(t *testing.T) {
	base := time.Unix(1000, 0)
	r := New(4)
	r.Arrive = base
	r.AddToken(at(base, 10), 3, true)
	r.SplitChoices(5)
	s, _ := r.ChoiceSlot(7)
	r.AddChoiceToken(0, at(base, 20), 2, true)
	r.AddChoiceToken(uint8(s), at(base, 30), 0, true)
	r.AddChoiceToken(uint8(s), at(base, 50), 4, true)
	empty, _ := r.ChoiceSlot(9)
	if n := r.Choices[0].OutputTokens(); n != 5 {
		t.Errorf("choice 0: %d tokens, want 3 + 2", n)
	}
	if n := r.Choices[s].OutputTokens(); n != 2 {
		t.Errorf("choice 1: %d tokens, want its 2 events (one count unknown)", n)
	}
	if d, ok := r.Choices[0].TPOT(); !ok || d != 10*msec/4 {
		t.Errorf("choice 0 TPOT %v, want 10 ms / 4", d)
	}
	c := r.Choices[empty]
	if _, ok := c.TPOT(); ok || c.OutputTokens() != -1 || c.Index != 9 {
		t.Errorf("empty choice %+v", c)
	}
	b, _ := r.MarshalJSON()
	if !strings.Contains(string(b), `{"index":9,"ttft_ms":null,"tpot_ms":null,"max_itl_ms":null,"token_events":0,"output_tokens":null,"finish_reason":""}`) {
		t.Errorf("JSON of a choice without token events:\n%s", b)
	}
	// Two choices of one token each: no gap, no max ITL.
	r = New(2)
	r.Arrive = base
	r.AddToken(at(base, 10), 0, true)
	r.SplitChoices(0)
	r.ChoiceSlot(1)
	r.AddChoiceToken(1, at(base, 40), 0, true)
	if _, ok := r.MaxITL(); ok {
		t.Error("max ITL defined without two events of one choice")
	}
	if _, ok := r.TPOT(); ok {
		t.Error("TPOT defined for one-token choices")
	}
}

// At most MaxChoices choices are followed; the events of the others
// count in TokenAt only, and the rest is counted.
func TestChoicesBounded(t *testing.T) {
	base := time.Unix(1000, 0)
	r := New(64)
	r.Arrive = base
	r.SplitChoices(0)
	for i := 1; i < MaxChoices; i++ {
		if _, ok := r.ChoiceSlot(int64(i)); !ok {
			t.Fatalf("no room for choice %d", i)
		}
	}
	if _, ok := r.ChoiceSlot(MaxChoices); ok {
		t.Fatal("room beyond MaxChoices")
	}
	r.ChoicesUntracked = 1
	r.AddChoiceToken(UntrackedChoice, at(base, 10), 0, true)
	r.AddChoiceToken(UntrackedChoice, at(base, 20), 0, true)
	if r.TokenEvents() != 2 || r.Choices[0].Events != 0 {
		t.Fatalf("untracked events: %d token events, choice 0 has %d", r.TokenEvents(), r.Choices[0].Events)
	}
	n := 0
	r.Gaps(func(time.Duration) { n++ })
	if n != 0 {
		t.Fatalf("%d gaps of untracked choices", n)
	}
	b, _ := r.MarshalJSON()
	if !strings.Contains(string(b), `"choices_untracked":1`) {
		t.Errorf("JSON lacks choices_untracked:\n%s", b)
	}
}

// A record with one choice writes no choices field, and adding a choice's
// token event allocates nothing once the room is there.
func TestChoicesAbsentAndAllocationFree(t *testing.T) {
	base := time.Unix(1000, 0)
	r := New(4)
	r.Arrive = base
	r.AddToken(at(base, 10), 0, true)
	if b, _ := r.MarshalJSON(); strings.Contains(string(b), "choices") || r.FinishReasons() != nil {
		t.Fatalf("one choice: %s", b)
	}
	r = New(2048)
	r.Arrive = base
	r.SplitChoices(0)
	r.ChoiceSlot(1)
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		i++
		r.AddChoiceToken(uint8(i%2), base.Add(time.Duration(i)*time.Millisecond), 1, true)
	}); n != 0 {
		t.Fatalf("%.1f allocations per choice token event", n)
	}
}
