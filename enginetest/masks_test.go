package enginetest

import "regexp"

// The masks of the byte-identity tests: the only bytes of Ollama's
// answers that differ between two identical greedy requests, because
// Ollama draws them per request (ids) or reads them from the clock
// (timestamps, durations). Each is replaced by a fixed string in both the
// direct answer and the answer through the sidecar before they are
// compared; every other byte must be equal. Values from Ollama v0.17.4's
// openai/, middleware/ and server/ code (ids: random numbers or hex;
// created: time.Now().Unix()).
var masks = []struct {
	re   *regexp.Regexp
	repl string
	why  string
}{
	// OpenAI Chat Completions and Completions: "chatcmpl-<n>", "cmpl-<n>".
	{regexp.MustCompile(`"id":"(chatcmpl|cmpl)-[0-9]+"`), `"id":"$1-ID"`, "per-request id"},
	// OpenAI: Unix seconds of the answer.
	{regexp.MustCompile(`"created":[0-9]+`), `"created":0`, "clock"},
	// Responses API: "resp_<n>" (the response), "msg_<n>" (its output item,
	// also as item_id); Messages API: "msg_<24 hex>".
	{regexp.MustCompile(`"(resp|msg|rs|fc)_[0-9a-f]+"`), `"$1_ID"`, "per-request id"},
	// Responses API: Unix seconds.
	{regexp.MustCompile(`"(created_at|completed_at)":[0-9]+`), `"$1":0`, "clock"},
	// Messages API errors: "request_id":"req_<24 hex>".
	{regexp.MustCompile(`"request_id":"req_[0-9a-f]+"`), `"request_id":"req_ID"`, "per-request id"},
	// Ollama native: RFC 3339 instant of each line.
	{regexp.MustCompile(`"created_at":"[^"]*"`), `"created_at":"T"`, "clock"},
	// Ollama native: nanosecond durations on the final line.
	{regexp.MustCompile(`"(total_duration|load_duration|prompt_eval_duration|eval_duration)":[0-9]+`), `"$1":0`, "clock"},
}

// mask applies every mask to b.
func mask(b []byte) []byte {
	for _, m := range masks {
		b = m.re.ReplaceAll(b, []byte(m.repl))
	}
	return b
}
