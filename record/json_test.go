package record

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// jsonStrings are the strings appendJSONString must escape exactly as
// encoding/json does: every byte alone, HTML characters, the JSONP line
// separators, invalid and truncated UTF-8.
func jsonStrings() []string {
	ss := []string{"", "plain", `a"b\c`, "<script>&amp;</script>", "\u2028\u2029x\u2027\u202a", "é€😀",
		"\xff\xfe", "\xe2\x82", "a\xe2\x82\xacb\xc3", "\x00\x1f\x7f\b\f\n\r\t", strings.Repeat("é", 300) + "\xf0\x9f"}
	for c := range 256 {
		ss = append(ss, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	return ss
}

func TestAppendJSONStringIsEncodingJSONs(t *testing.T) {
	for _, s := range jsonStrings() {
		want, _ := json.Marshal(s)
		if got := appendJSONString([]byte("p"), s); string(got) != "p"+string(want) {
			t.Errorf("%q: got %s, want %s", s, got[1:], want)
		}
	}
	b := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { b = appendJSONString(b[:0], "a\"<\u2028\xffé") }); n != 0 {
		t.Errorf("%.1f allocations per string", n)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStrings() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Errorf("%q: got %s, want %s", s, got, want)
		}
	})
}

// The members table writes each name once and in the documented order;
// a record with every optional member set writes them all.
func TestMembersWrittenOnceInOrder(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range members {
		if seen[m.name] || m.key != `"`+m.name+`":` {
			t.Errorf("member %q twice or key %q", m.name, m.key)
		}
		seen[m.name] = true
	}
	r := benchRecord()
	r.Target, r.TargetRule, r.ModelTruncated, r.ErrorCode, r.CachedTokens = "h:1", "h", true, 7, 3
	r.Tenant = "acme"
	r.Malformed, r.UsageInjected, r.TapFailed, r.OversizedEvents, r.RequestRead = true, true, "panic", 1, "partial"
	r.Structure, r.StructureFailed, r.StructureUnchecked = "fail", []string{"tool_args_schema"}, "request_partial"
	r.Engine.Known = EngineLoad | EngineQueue | EnginePrompt | EngineDecode | EngineInference | EngineTotal
	r.Upstream.Asked, r.PreemptionsDuring, r.StallCause = true, 0, "preemption"
	r.Causes, r.CausesCut = []Cause{{What: "stall", Cause: "preemption", Ms: 1200, At: r.Arrive.Add(time.Second), Ref: "0a1b2c3d-41"}}, 1
	r.SplitChoices(0)
	r.ChoiceSlot(1)
	r.ChoicesUntracked, r.ChoiceIndexUnread = 1, 2
	r.Probe = &ProbeInfo{Name: "p", Scheduled: r.Arrive.Add(-time.Millisecond)}
	r.Replay = &ReplayInfo{Line: 3, Scheduled: r.Arrive.Add(-time.Millisecond), Rate: 2}
	r.EnergySource, r.EnergyInterval, r.DecodeSOL = "counter", time.Second, 0.5
	b, _ := r.MarshalJSON()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	last := -1
	for _, mb := range members {
		i := strings.Index(string(b), mb.key)
		if _, ok := m[mb.name]; !ok || i < last {
			t.Errorf("%s missing or out of order in %s", mb.name, b)
		}
		last = i
	}
	if len(m) != len(members) {
		t.Errorf("%d members written, the table has %d", len(m), len(members))
	}
}
