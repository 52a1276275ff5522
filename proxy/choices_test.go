package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/slo"
	"github.com/tokentap/tokentap/stream"
)

// chunk is one SSE event of an OpenAI chat stream with one choice.
func chunk(index int, delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":%d,"delta":%s,"finish_reason":%s}]}`+"\n\n", index, delta, f)
}

// twoChoices is an n = 2 stream: each choice a token every 60 ms, the
// second 30 ms after the first, so that pooled the events come every
// 30 ms; choice 0's tokens at 100, 160, 220, 280 ms, choice 1's at 130,
// 190, 250, 310 ms. finish1 is choice 1's finish reason ("": none), tail
// what follows the finish reasons.
func twoChoices(finish1 string, tail ...string) []step {
	var steps []step
	add := func(at int, raw string) {
		steps = append(steps, step{at: time.Duration(at) * time.Millisecond, raw: raw, client: raw})
	}
	add(90, chunk(0, `{"role":"assistant","content":""}`, ""))
	add(91, chunk(1, `{"role":"assistant","content":""}`, ""))
	for k := range 4 {
		add(100+60*k, chunk(0, fmt.Sprintf(`{"content":"a%d"}`, k), ""))
		add(130+60*k, chunk(1, fmt.Sprintf(`{"content":"b%d"}`, k), ""))
	}
	add(311, chunk(0, `{}`, "stop"))
	if finish1 != "" {
		add(312, chunk(1, `{}`, finish1))
	}
	for i, raw := range tail {
		add(313+i, raw)
	}
	return steps
}

const twoChoicesBody = `{"model":"m","stream":true,"n":2,"stream_options":{"include_usage":true},"messages":[]}`

// n = 2 at 60 ms per token per choice: TPOT 60 ms (pooled it read 30),
// so a 50 ms TPOT SLO fails; TTFT is the first token of either choice;
// both finish reasons are kept.
func TestTwoChoicesTimedEach(t *testing.T) {
	steps := twoChoices("length", `data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":8}}`+"\n\n", "data: [DONE]\n\n")
	r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps}, Options{}, "/v1/chat/completions", twoChoicesBody)
	if r.Outcome != record.Success || r.OutputTokens != 8 || r.TokenSource != "usage" || r.TokenEvents() != 8 {
		t.Fatalf("outcome %s/%s, %d tokens (%s), %d token events", r.Outcome, r.ErrorType, r.OutputTokens, r.TokenSource, r.TokenEvents())
	}
	if d, ok := r.TPOT(); !ok || d != 60*time.Millisecond {
		t.Errorf("TPOT %v (%v), want each choice's 60 ms, not the pooled 30", d, ok)
	}
	if d, ok := r.MaxITL(); !ok || d != 60*time.Millisecond {
		t.Errorf("max ITL %v (%v), want 60 ms", d, ok)
	}
	if d, _ := r.TTFT(); d != 100*time.Millisecond {
		t.Errorf("TTFT %v, want the first token of any choice, 100 ms", d)
	}
	var gaps []time.Duration
	r.Gaps(func(g time.Duration) { gaps = append(gaps, g) })
	if len(gaps) != 6 || slices.Max(gaps) != 60*time.Millisecond || slices.Min(gaps) != 60*time.Millisecond {
		t.Errorf("gaps %v, want six of 60 ms (each choice's own)", gaps)
	}
	if got := r.FinishReasons(); !slices.Equal(got, []string{"stop", "length"}) || r.FinishReason != "stop" {
		t.Errorf("finish reasons %q (record's %q), want both: stop, length", got, r.FinishReason)
	}
	if len(r.Choices) != 2 || r.Choices[1].Index != 1 || r.Choices[1].Events != 4 {
		t.Fatalf("choices %+v", r.Choices)
	}
	if d, _ := r.Choices[1].TPOT(); d != 60*time.Millisecond {
		t.Errorf("choice 1 TPOT %v, want 60 ms", d)
	}
	o := config.Objective{Name: "chat", Target: 0.9, Thresholds: config.Thresholds{TPOT: 50 * time.Millisecond, MaxITL: 55 * time.Millisecond}}
	v, ok := slo.Evaluate(&o, r)
	if !ok || v.Qualified || !slices.Equal(v.Failed, []string{slo.TPOT, slo.MaxITL}) {
		t.Errorf("verdict %+v, want tpot and max_itl failed", v)
	}
	b, _ := r.MarshalJSON()
	for _, want := range []string{`"tpot_ms":60,`, `"max_itl_ms":60,"choices":[{"index":0,"ttft_ms":100,"tpot_ms":60,"max_itl_ms":60,"token_events":4,"output_tokens":4,"finish_reason":"stop"},{"index":1,"ttft_ms":130,`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("record JSON lacks %s:\n%s", want, b)
		}
	}
}

// A clean EOF with one choice finished and the other not: the second was
// cut short, and the request is error/incomplete_stream. Both finished
// and no end marker: success.
func TestChoiceWithoutFinishReasonIsIncomplete(t *testing.T) {
	r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: twoChoices("")}, Options{}, "/v1/chat/completions", twoChoicesBody)
	if r.Outcome != record.Error || r.ErrorType != record.ErrIncomplete {
		t.Errorf("one choice unfinished: %s/%s, want error/incomplete_stream", r.Outcome, r.ErrorType)
	}
	if got := r.FinishReasons(); !slices.Equal(got, []string{"stop", ""}) {
		t.Errorf("finish reasons %q", got)
	}
	r, _ = runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: twoChoices("stop")}, Options{}, "/v1/chat/completions", twoChoicesBody)
	if r.Outcome != record.Success {
		t.Errorf("both finished, clean EOF: %s/%s, want success", r.Outcome, r.ErrorType)
	}
}

// One payload may carry several choices (a non-streaming body always
// does for n > 1): each choice's finish reason is kept, and a streamed
// payload gives each choice its own token event.
func TestSeveralChoicesInOnePayload(t *testing.T) {
	body := `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"},` +
		`{"index":1,"message":{"role":"assistant","content":"b"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":9}}`
	steps := []step{{at: 9 * time.Millisecond, raw: body, client: body}}
	r, _ := runLockstep(t, &lockstepUp{ct: "application/json", steps: steps}, Options{}, "/v1/chat/completions", `{"model":"m","n":2,"messages":[]}`)
	if r.Outcome != record.Success || !slices.Equal(r.FinishReasons(), []string{"stop", "length"}) || r.OutputTokens != 9 {
		t.Errorf("whole body: %s, finish reasons %q, %d tokens", r.Outcome, r.FinishReasons(), r.OutputTokens)
	}
	two := `data: {"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}` + "\n\n"
	steps = []step{
		{at: 10 * time.Millisecond, raw: two, client: two},
		{at: 70 * time.Millisecond, raw: two, client: two},
		{at: 71 * time.Millisecond, raw: chunk(1, `{}`, "stop"), client: chunk(1, `{}`, "stop")},
	}
	r, _ = runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps}, Options{}, "/v1/chat/completions", twoChoicesBody)
	if r.TokenEvents() != 4 || len(r.Choices) != 2 || r.Choices[0].Events != 2 || r.Choices[1].Events != 2 {
		t.Fatalf("%d token events, choices %+v", r.TokenEvents(), r.Choices)
	}
	if d, ok := r.TPOT(); !ok || d != 60*time.Millisecond || r.OutputTokens != 4 {
		t.Errorf("TPOT %v (%v), %d tokens; want 60 ms, 4 events", d, ok, r.OutputTokens)
	}
	if r.Outcome != record.Error || r.ErrorType != record.ErrIncomplete {
		t.Errorf("choice 0 unfinished at a clean EOF: %s/%s", r.Outcome, r.ErrorType)
	}
}

// Beyond record.MaxChoices the choices are counted, not timed; each must
// still finish for a clean EOF to be a success.
func TestChoicesBeyondTheCap(t *testing.T) {
	var steps []step
	n := record.MaxChoices + 2
	for i := range n {
		raw := chunk(i, `{"content":"x"}`, "")
		steps = append(steps, step{at: time.Duration(10+i) * time.Millisecond, raw: raw, client: raw})
	}
	for i := range n - 1 {
		raw := chunk(i, `{}`, "stop")
		steps = append(steps, step{at: time.Duration(100+i) * time.Millisecond, raw: raw, client: raw})
	}
	r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps}, Options{}, "/v1/chat/completions", twoChoicesBody)
	if len(r.Choices) != record.MaxChoices || r.ChoicesUntracked != 2 || r.TokenEvents() != n {
		t.Fatalf("%d choices, %d untracked, %d token events", len(r.Choices), r.ChoicesUntracked, r.TokenEvents())
	}
	if r.Outcome != record.Error || r.ErrorType != record.ErrIncomplete {
		t.Errorf("the last untracked choice unfinished: %s/%s", r.Outcome, r.ErrorType)
	}
}

// A streamed refusal (OpenAI's delta.refusal) is the answer: it has a
// TTFT, so TTFT and TPOT SLOs judge it.
func TestRefusalStreamHasTTFT(t *testing.T) {
	steps := []step{
		{at: 40 * time.Millisecond, raw: chunk(0, `{"role":"assistant","content":null,"refusal":""}`, "")},
		{at: 250 * time.Millisecond, raw: chunk(0, `{"refusal":"I'm sorry,"}`, "")},
		{at: 290 * time.Millisecond, raw: chunk(0, `{"refusal":" I can't help with that."}`, "")},
		{at: 300 * time.Millisecond, raw: chunk(0, `{}`, "stop")},
		{at: 301 * time.Millisecond, raw: "data: [DONE]\n\n"},
	}
	for i := range steps {
		steps[i].client = steps[i].raw
	}
	r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps}, Options{}, "/v1/chat/completions", streamBody)
	if d, ok := r.TTFT(); !ok || d != 250*time.Millisecond || r.TokenEvents() != 2 {
		t.Fatalf("TTFT %v (%v), %d token events; want 250 ms, 2", d, ok, r.TokenEvents())
	}
	if d, ok := r.TTFOT(); !ok || d != 250*time.Millisecond {
		t.Errorf("TTFOT %v (%v): a refusal is output, not reasoning", d, ok)
	}
	o := config.Objective{Name: "chat", Target: 0.9, Thresholds: config.Thresholds{TTFT: 200 * time.Millisecond, TPOT: 50 * time.Millisecond}}
	if v, _ := slo.Evaluate(&o, r); !slices.Equal(v.Failed, []string{slo.TTFT}) || len(v.NotApplicable) != 0 {
		t.Errorf("verdict %+v, want ttft failed and tpot judged", v)
	}
}

// Following two choices allocates nothing per token event once the
// record has split (the split itself allocates once per response).
func TestTapZeroAllocsPerEventTwoChoices(t *testing.T) {
	ev := []byte(chunk(0, `{"content":" x"}`, "") + chunk(1, `{"content":" y"}`, ""))
	st := realState(8192)
	tp := newTap(&loopReader{ev: ev}, st, bodySSE, stream.FormatOpenAI, false, 1<<20)
	p := make([]byte, 32<<10)
	for range 100 {
		tp.Read(p)
	}
	if len(st.rec.Choices) != 2 || st.rec.Choices[1].Events < 90 {
		t.Fatalf("choices %+v", st.rec.Choices)
	}
	if n := testing.AllocsPerRun(1000, func() { tp.Read(p) }); n != 0 {
		t.Errorf("%.2f allocations per read of two choices' events", n)
	}
}

// A choice index beyond what the parser reads (10^18: more than 18
// digits) names no choice: it was read as 0 and its events pooled with
// choice 0's (TPOT 30 ms instead of 60). Now that choice is untracked,
// never pooled, and every payload of it is counted (issue 40, item 9).
func TestUnreadChoiceIndexIsUntrackedAndCounted(t *testing.T) {
	const huge = 1000000000000000000
	steps := func(indices ...int) []step {
		var out []step
		add := func(at int, raw string) {
			out = append(out, step{at: time.Duration(at) * time.Millisecond, raw: raw, client: raw})
		}
		for i, index := range indices {
			add(90+i, chunk(index, `{"role":"assistant","content":""}`, ""))
		}
		for k := range 4 {
			for i, index := range indices {
				add(100+60*k+30*i, chunk(index, fmt.Sprintf(`{"content":"a%d"}`, k), ""))
			}
		}
		for i, index := range indices {
			add(311+i, chunk(index, `{}`, "stop"))
		}
		add(320, "data: [DONE]\n\n")
		return out
	}
	t.Run("beside choice 0", func(t *testing.T) {
		r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps(0, huge)}, Options{}, "/v1/chat/completions", twoChoicesBody)
		if r.Outcome != record.Success || r.TokenEvents() != 8 {
			t.Fatalf("outcome %s/%s, %d token events", r.Outcome, r.ErrorType, r.TokenEvents())
		}
		if len(r.Choices) != 1 || r.Choices[0].Index != 0 || r.Choices[0].Events != 4 || r.Choices[0].FinishReason != "stop" {
			t.Fatalf("choices %+v, want choice 0 alone with its 4 events", r.Choices)
		}
		if r.ChoicesUntracked != 1 || r.ChoiceIndexUnread != 6 {
			t.Errorf("untracked %d, unread index %d, want 1 and 6 (payloads)", r.ChoicesUntracked, r.ChoiceIndexUnread)
		}
		if d, ok := r.TPOT(); !ok || d != 60*time.Millisecond {
			t.Errorf("TPOT %v (%v), want choice 0's 60 ms, not the pooled 30", d, ok)
		}
		b, _ := r.MarshalJSON()
		if !strings.Contains(string(b), `"choices_untracked":1,"choice_index_unread":6}`) {
			t.Errorf("record %s", b)
		}
	})
	t.Run("alone", func(t *testing.T) {
		r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps(huge)}, Options{}, "/v1/chat/completions", streamBody)
		if r.Outcome != record.Success || r.TokenEvents() != 4 {
			t.Fatalf("outcome %s/%s, %d token events", r.Outcome, r.ErrorType, r.TokenEvents())
		}
		if r.Choices == nil || len(r.Choices) != 0 || r.ChoicesUntracked != 1 || r.ChoiceIndexUnread != 6 {
			t.Errorf("choices %+v, untracked %d, unread index %d, want none tracked, 1, 6", r.Choices, r.ChoicesUntracked, r.ChoiceIndexUnread)
		}
		if d, ok := r.TPOT(); ok {
			t.Errorf("TPOT %v, want none: no choice is tracked", d)
		}
		b, _ := r.MarshalJSON()
		if !strings.Contains(string(b), `"choices":[],"choices_untracked":1,"choice_index_unread":6}`) {
			t.Errorf("record %s", b)
		}
	})
}

// An upstream that names a new choice index in every payload fills a
// bounded map: past maxUntracked untracked choices, every new index is
// one more (overflowChoice), and its finish reason still counts.
func TestUntrackedChoicesAreBounded(t *testing.T) {
	const n, per = 3000, 500 // choices, choices per payload
	payload := func(from int, delta, finish string) string {
		var b strings.Builder
		b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[`)
		for i := from; i < from+per; i++ {
			if i > from {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"index":%d,"delta":%s,"finish_reason":%s}`, i, delta, finish)
		}
		b.WriteString("]}\n\n")
		return b.String()
	}
	var steps []step
	add := func(raw string) {
		steps = append(steps, step{at: time.Duration(10+len(steps)) * time.Millisecond, raw: raw, client: raw})
	}
	for from := 0; from < n; from += per {
		add(payload(from, `{"content":"x"}`, "null"))
	}
	for from := 0; from < n; from += per {
		add(payload(from, `{}`, `"stop"`))
	}
	r, _ := runLockstep(t, &lockstepUp{ct: "text/event-stream", steps: steps}, Options{}, "/v1/chat/completions", twoChoicesBody)
	if len(r.Choices) != record.MaxChoices || r.ChoicesUntracked != maxUntracked+1 {
		t.Fatalf("%d choices, %d untracked, want %d and %d", len(r.Choices), r.ChoicesUntracked, record.MaxChoices, maxUntracked+1)
	}
	if r.Outcome != record.Success {
		t.Errorf("every choice finished, outcome %s/%s", r.Outcome, r.ErrorType)
	}
}
