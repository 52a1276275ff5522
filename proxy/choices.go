package proxy

import (
	"math"
	"time"

	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// choiceTrack follows the choices of a response (OpenAI's n > 1,
// docs/measurement.md §3, "Several choices"). Until a second choice
// index appears the tap times the response as one answer, as it always
// has: the one-choice path costs one comparison per event. When a second
// index appears, the record splits (record.SplitChoices: what was
// recorded so far is the first choice's) and from then on every token
// event and finish reason goes to its own choice.
type choiceTrack struct {
	seen  bool  // a payload has named a choice
	first int64 // the index of the first choice named
	split bool  // a second index appeared: the record follows choices one by one
	slot  uint8 // the current payload's choice in rec.Choices, once split

	// untracked: the choices beyond record.MaxChoices, and whether each
	// finished; nil until there is one. At most maxUntracked+1 entries.
	untracked map[int64]bool
	ukey      int64 // the current payload's key in untracked, when slot is record.UntrackedChoice
	// each reads a payload that carries several choices one by one
	// (stream.EachChoice); nil until there is one.
	each *choiceScratch
}

// choiceScratch is stream.EachChoice's scratch and callback, allocated once
// per response that needs it.
type choiceScratch struct {
	c  stream.Chunk
	fn func(*stream.Chunk)
	at time.Time // the instant of the payload being read
}

// choice selects the choice a payload (of one choice) belongs to and
// reports whether the record follows choices one by one; the choice's
// position is then t.ch.slot.
func (t *tap) choice(index int64) bool {
	ch := &t.ch
	switch {
	case index == stream.IndexOutOfRange:
		return t.unreadChoice()
	case !ch.seen && !ch.split:
		ch.seen, ch.first = true, index
		return false
	case !ch.split && index == ch.first:
		return false
	case !ch.split:
		ch.split = true
		t.st.rec.SplitChoices(ch.first)
	}
	rec := t.st.rec
	if slot, ok := rec.ChoiceSlot(index); ok {
		ch.slot = uint8(slot)
		return true
	}
	t.untrack(index)
	return true
}

// unreadChoice selects the choice of a payload whose index the parser
// did not read (stream.IndexOutOfRange; 10^18 was read as 0 and pooled
// with choice 0): it names no choice the tap can tell from another, so
// it is untracked, never pooled with a named choice, and counted
// (record.Record.ChoiceIndexUnread). The record follows choices one by
// one from then on, as after a second index.
func (t *tap) unreadChoice() bool {
	ch, rec := &t.ch, t.st.rec
	rec.ChoiceIndexUnread++
	if !ch.split {
		ch.split = true
		if ch.seen {
			rec.SplitChoices(ch.first)
		} else {
			rec.FollowChoices()
		}
	}
	t.untrack(stream.IndexOutOfRange)
	return true
}

// maxUntracked bounds the untracked choices a response's tap tells
// apart, a map entry each (OpenAI allows n up to 128): past it, every new
// index is one more choice, overflowChoice, as all unread indices are
// one, so that an upstream naming a new index in every payload fills a
// bounded map, not one that grows with the stream.
const maxUntracked = 1024

// overflowChoice is the key of the choices past maxUntracked: no index
// the parser reads (at most 18 digits) is this.
const overflowChoice = math.MaxInt64

// untrack makes the payload's choice, index, an untracked one: beyond
// record.MaxChoices, or unread (all unread indices are one), or past
// maxUntracked (all of those are one too).
func (t *tap) untrack(index int64) {
	ch, rec := &t.ch, t.st.rec
	ch.slot = record.UntrackedChoice
	if _, known := ch.untracked[index]; !known {
		if len(ch.untracked) >= maxUntracked {
			index = overflowChoice
		}
		if ch.untracked == nil {
			ch.untracked = map[int64]bool{}
		}
		if _, known := ch.untracked[index]; !known {
			ch.untracked[index] = false
			rec.ChoicesUntracked = len(ch.untracked)
		}
	}
	ch.ukey = index
}

// finishChoice keeps the finish reason of the payload's choice, once the
// record follows choices one by one.
func (t *tap) finishChoice(reason []byte) {
	if t.ch.slot == record.UntrackedChoice {
		t.ch.untracked[t.ch.ukey] = true
		return
	}
	t.st.rec.SetChoiceFinish(int(t.ch.slot), reason)
}

// eachChoice applies, one by one, the choices of a payload that carries
// several (c.ChoicesData), read at `at`.
func (t *tap) eachChoice(c *stream.Chunk, at time.Time) {
	if t.ch.each == nil {
		e := &choiceScratch{}
		e.fn = func(c *stream.Chunk) { t.applyChoice(c, e.at) }
		t.ch.each = e
	}
	t.ch.each.at = at
	stream.EachChoice(c.ChoicesData, &t.ch.each.c, t.ch.each.fn)
}

// allFinished reports whether every choice of the response has a finish
// reason: the one answer's, or, once the record follows choices one by
// one, every choice's (docs/measurement.md §3: a stream that ends
// cleanly with a choice unfinished was cut short).
func (t *tap) allFinished() bool {
	rec := t.st.rec
	if !t.ch.split {
		return rec.FinishReason != ""
	}
	for i := range rec.Choices {
		if rec.Choices[i].FinishReason == "" {
			return false
		}
	}
	for _, done := range t.ch.untracked {
		if !done {
			return false
		}
	}
	return true
}
