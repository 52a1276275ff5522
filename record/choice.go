package record

import (
	"math"
	"strconv"
	"time"
)

// Per-choice timing (docs/measurement.md §3, "Several choices"). A
// response to a request with n > 1 interleaves the events of its
// choices; pooled, two choices at 60 ms per token read as one answer at
// 30 ms per token. Once a response has carried a second choice index,
// the record follows each choice on its own: its first and last token,
// its gaps, its token count and its finish reason. The request's TTFT
// stays the first token of any choice; its TPOT and max ITL are the
// worst choice's, and its ITL gaps are each choice's own.
//
// A response with one choice (nearly all) never gets here: its record
// keeps Choices nil and is timed as it always was.

// MaxChoices bounds the choices a record follows one by one: the events
// of further choices count in TokenAt and the request's token count,
// not in any choice's timing, and ChoicesUntracked counts those choices.
const MaxChoices = 16

// UntrackedChoice is EventChoice's value for an event of a choice beyond
// MaxChoices.
const UntrackedChoice = math.MaxUint8

// Choice is one choice of a response that carried more than one. Time
// fields are zero when the instant did not happen (a choice that never
// sent a token event).
type Choice struct {
	// Index is the choice's "index" in the response.
	Index                                   int64
	FirstToken, FirstOutputToken, LastToken time.Time
	// Events counts the choice's token-bearing events.
	Events int
	// MaxGap is the largest gap between two of the choice's own token
	// events (0 with fewer than two).
	MaxGap time.Duration
	// FinishReason is the choice's finish reason; "" until it finished.
	FinishReason string
	// tokenSum sums the token counts of its events while every one of
	// them said how many it carried (perEvent).
	tokenSum int64
	perEvent bool
}

// OutputTokens is the choice's output token count: its events' own
// counts summed when every one of its events said how many it carried
// (token ids, logprobs), else its token events; -1 when it had none.
// The usage numbers pool the choices, so they count none of them.
func (c *Choice) OutputTokens() int64 {
	switch {
	case c.Events == 0:
		return -1
	case c.perEvent:
		return c.tokenSum
	}
	return int64(c.Events)
}

// TPOT is (LastToken − FirstToken) / (n − 1) with n the choice's
// OutputTokens; ok is false for n ≤ 1.
func (c *Choice) TPOT() (time.Duration, bool) {
	n := c.OutputTokens()
	if c.FirstToken.IsZero() || n < 2 {
		return 0, false
	}
	return c.LastToken.Sub(c.FirstToken) / time.Duration(n-1), true
}

// SplitChoices starts per-choice timing: the response has shown a second
// choice index, and everything recorded so far belongs to the first,
// whose index is first. The tap calls it once, when the second index
// appears; it allocates Choices (MaxChoices of room) and EventChoice
// then, never per event.
func (r *Record) SplitChoices(first int64) {
	c := Choice{Index: first, FirstToken: r.FirstToken, FirstOutputToken: r.FirstOutputToken, LastToken: r.LastToken,
		Events: len(r.TokenAt), MaxGap: r.MaxGap, FinishReason: r.FinishReason, perEvent: r.PerEventKnown()}
	if c.perEvent {
		for _, k := range r.TokensPerEvent {
			c.tokenSum += int64(k)
		}
	}
	r.follow(0)
	r.Choices = append(r.Choices, c)
}

// FollowChoices starts per-choice timing before any choice was named:
// the response's first choice index was one the parser does not read
// (stream.IndexOutOfRange), so no choice is tracked yet, and the events
// so far (there are none in practice) belong to no choice. Choices is
// then empty, not nil.
func (r *Record) FollowChoices() { r.follow(UntrackedChoice) }

// follow makes Choices empty with room for MaxChoices, and EventChoice
// parallel to TokenAt with every event so far at slot.
func (r *Record) follow(slot uint8) {
	if cap(r.Choices) < MaxChoices {
		r.Choices = make([]Choice, 0, MaxChoices)
	}
	r.Choices = r.Choices[:0]
	if cap(r.EventChoice) < cap(r.TokenAt) {
		r.EventChoice = make([]uint8, len(r.TokenAt), cap(r.TokenAt))
	} else {
		r.EventChoice = r.EventChoice[:len(r.TokenAt)]
	}
	for i := range r.EventChoice {
		r.EventChoice[i] = slot
	}
}

// ChoiceSlot returns the position in Choices of the choice with the
// given index, adding it when it is new and there is room; ok is false
// for a choice beyond MaxChoices. Call it only after SplitChoices.
func (r *Record) ChoiceSlot(index int64) (slot int, ok bool) {
	for i := range r.Choices {
		if r.Choices[i].Index == index {
			return i, true
		}
	}
	if len(r.Choices) == MaxChoices {
		return 0, false
	}
	r.Choices = append(r.Choices, Choice{Index: index})
	return len(r.Choices) - 1, true
}

// AddChoiceToken is AddToken once choices are followed one by one: the
// token event, read at t and carrying k tokens (k <= 0: unknown), of the
// choice at slot in Choices (UntrackedChoice: one beyond MaxChoices). It
// returns the gap to that choice's previous token event (0 and false for
// its first, and for an untracked choice). It does not allocate while
// the record's capacity lasts.
func (r *Record) AddChoiceToken(slot uint8, t time.Time, k int64, output bool) (gap time.Duration, ok bool) {
	r.appendEvent(t, k, output)
	r.EventChoice = append(r.EventChoice, slot)
	if int(slot) >= len(r.Choices) {
		return 0, false
	}
	c := &r.Choices[slot]
	if c.FirstToken.IsZero() {
		c.FirstToken, c.perEvent = t, true
	} else {
		gap, ok = t.Sub(c.LastToken), true
		c.MaxGap = max(c.MaxGap, gap)
		r.MaxGap = max(r.MaxGap, gap)
	}
	if output && c.FirstOutputToken.IsZero() {
		c.FirstOutputToken = t
	}
	c.LastToken = t
	c.Events++
	if k > 0 && c.perEvent {
		c.tokenSum += k
	} else {
		c.perEvent = false
	}
	return gap, ok
}

// SetChoiceFinish keeps the finish reason of the choice at slot in
// Choices; the record's own FinishReason is the first choice's.
func (r *Record) SetChoiceFinish(slot int, reason []byte) {
	c := &r.Choices[slot]
	if c.FinishReason != string(reason) {
		c.FinishReason = string(reason)
	}
	if slot == 0 {
		r.FinishReason = c.FinishReason
	}
}

// FinishReasons returns every choice's finish reason, in the order the
// choices appeared (each choice's, "" for one that did not finish), or
// the record's one finish reason; nil when there is none.
func (r *Record) FinishReasons() []string {
	if len(r.Choices) == 0 {
		if r.FinishReason == "" {
			return nil
		}
		return []string{r.FinishReason}
	}
	out := make([]string, len(r.Choices))
	for i := range r.Choices {
		out[i] = r.Choices[i].FinishReason
	}
	return out
}

// choicesTPOT is the worst (largest) TPOT of the choices; ok is false
// when no choice has one.
func (r *Record) choicesTPOT() (worst time.Duration, ok bool) {
	for i := range r.Choices {
		if d, has := r.Choices[i].TPOT(); has && (!ok || d > worst) {
			worst, ok = d, true
		}
	}
	return worst, ok
}

// choiceGaps calls fn with every gap between two token events of the
// same choice, in the order of the later event; untracked choices have
// none.
func (r *Record) choiceGaps(fn func(time.Duration)) {
	var last [MaxChoices]time.Duration
	var seen uint32
	for i, s := range r.EventChoice[:min(len(r.EventChoice), len(r.TokenAt))] {
		if int(s) >= MaxChoices {
			continue
		}
		if seen&(1<<s) != 0 {
			fn(r.TokenAt[i] - last[s])
		}
		seen |= 1 << s
		last[s] = r.TokenAt[i]
	}
}

// appendChoices writes the value of "choices": one object per choice
// followed.
func (r *Record) appendChoices(b []byte) []byte {
	opt := func(k string, d time.Duration, ok bool) {
		b = append(b, `,"`...)
		b = append(b, k...)
		b = append(b, `":`...)
		if ok {
			b = strconv.AppendFloat(b, ms(d), 'f', -1, 64)
		} else {
			b = append(b, "null"...)
		}
	}
	b = append(b, '[')
	for i := range r.Choices {
		c := &r.Choices[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, c.Index, 10)
		d, ok := since(r.Arrive, c.FirstToken)
		opt("ttft_ms", d, ok)
		d, ok = c.TPOT()
		opt("tpot_ms", d, ok)
		opt("max_itl_ms", c.MaxGap, c.Events >= 2)
		b = append(b, `,"token_events":`...)
		b = strconv.AppendInt(b, int64(c.Events), 10)
		b = append(b, `,"output_tokens":`...)
		if n := c.OutputTokens(); n >= 0 {
			b = strconv.AppendInt(b, n, 10)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"finish_reason":`...)
		b = appendJSONString(b, c.FinishReason)
		b = append(b, '}')
	}
	return append(b, ']')
}
