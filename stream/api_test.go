package stream

import (
	"slices"
	"strings"
	"testing"
)

// Every API is described once, with a unique name; every API with
// routes has a format and a probe, and every format an adapter and an
// answer reader.
func TestAPIDescriptions(t *testing.T) {
	seen := map[Name]bool{}
	for _, a := range APIs() {
		if a.Name == "" || seen[a.Name] {
			t.Fatalf("API name %q empty or repeated", a.Name)
		}
		seen[a.Name] = true
		if LookupAPI(string(a.Name)) != a || a.Name.API() != a {
			t.Fatalf("LookupAPI(%q) is not its description", a.Name)
		}
		if a.Operation != OpChat && a.Operation != OpTextCompletion && a.Operation != OpOther {
			t.Errorf("%s: operation %q is not a GenAI well-known value", a.Name, a.Operation)
		}
		if len(a.Routes) == 0 {
			if a.Format != nil || a.Probe != nil {
				t.Errorf("%s: a pass-through API with a format or a probe", a.Name)
			}
			continue
		}
		if a.Format == nil || a.Format.parse == nil || a.Probe == nil {
			t.Errorf("%s: format, adapter or probe missing", a.Name)
		}
		target, body := a.Probe(ProbeParams{Model: "m", Prompt: "p", MaxTokens: 4, Stream: true})
		path, _, _ := strings.Cut(target, "?") // the route is the URL's path
		if got := Classify(path, a.Engine); got != a {
			t.Errorf("%s: its probe's path %s is classified as %s", a.Name, path, got.Name)
		}
		if body == nil {
			t.Errorf("%s: no probe body", a.Name)
		}
		rq := a.Request
		if len(a.Response.Cut) == 0 {
			t.Errorf("%s: no finish reason says an answer was cut", a.Name)
		}
		if u := rq.Usage; u != nil && (u.Object == "" || u.Member == "" || u.Reply == "" || string(u.ReplyKey()) != `"`+u.Reply+`"`) {
			t.Errorf("%s: usage option %+v incomplete", a.Name, *u)
		}
		if rq.IgnoreEOS != "" && (slices.Contains(rq.MaxTokens, rq.IgnoreEOS) || strings.Contains(rq.IgnoreEOS, ".")) {
			t.Errorf("%s: ignore_eos member %q", a.Name, rq.IgnoreEOS)
		}
		// The text content capture reads is part of the prompt the
		// workload capture hashes: one description of the body.
		tx := rq.Text
		texts := append(append([]string{tx.Messages}, tx.Prompt...), tx.System...)
		if tx.Messages == "" && len(tx.Prompt) == 0 {
			t.Errorf("%s: no prompt text", a.Name)
		}
		for _, m := range texts {
			if m != "" && !slices.Contains(rq.Prompt, m) {
				t.Errorf("%s: text member %q is not in its prompt %v", a.Name, m, rq.Prompt)
			}
		}
		// The key the sidecar sends is one its tenant identity reads.
		if name, _ := a.KeyHeader("k"); !slices.Contains(a.Keys(), name) {
			t.Errorf("%s: sends its key in %s, reads it from %v", a.Name, name, a.Keys())
		}
		for _, h := range a.ProbeHeaders {
			if h[0] == "" || h[1] == "" {
				t.Errorf("%s: probe header %q", a.Name, h)
			}
		}
		for _, h := range a.Response.Headers {
			if h.Engine == "" || len(h.Times) == 0 {
				t.Errorf("%s: engine headers %+v", a.Name, *h)
			}
		}
	}
	if as := APIs(); as[len(as)-1] != APIOther {
		t.Errorf("APIOther is not last")
	}
}

// The routes, engine-dependent ones first (docs/records.md, api).
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		path, engine string
		want         *API
	}{
		{"/v1/chat/completions", "", APIChat},
		{"/chat/completions/", "", APIChat},
		{"/v1/completions", "", APICompletions},
		{"/completions", "", APICompletions},
		{"/completions", EngineLlamaCpp, APILlamaCppCompletion},
		{"/v1/completions", EngineLlamaCpp, APICompletions},
		{"/completion", "", APILlamaCppCompletion},
		{"/v1/responses", "", APIResponses},
		{"/responses", "", APIResponses},
		{"/x/responses", "", APIOther},
		{"/v1/messages", "", APIMessages},
		{"/api/chat", "", APIOllamaChat},
		{"/api/generate", "", APIOllamaGenerate},
		{"/generate_stream", "", APITGIGenerate},
		{"/generate", EngineTGI, APITGIGenerate},
		{"/generate", EngineSGLang, APIOther},
		{"/v1/embeddings", "", APIOther},
	} {
		if got := Classify(c.path, c.engine); got != c.want {
			t.Errorf("Classify(%q, %q) = %s, want %s", c.path, c.engine, got.Name, c.want.Name)
		}
	}
}

// An unknown API name is a programming error, never OpenAI.
func TestFormatOfUnknownAPIPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("FormatOfAPI of an unknown name did not panic")
		}
	}()
	FormatOfAPI("embeddings")
}

func TestSpanRouteAndEgressHosts(t *testing.T) {
	for path, want := range map[string]string{"/v1/chat/completions/": "/v1/chat/completions", "/x/chat/completions": "/chat/completions",
		"/x/v1/completions": "/v1/completions", "/completions": "/completions", "/api/chat": "/api/chat"} {
		if got := SpanRoute(path); got != want {
			t.Errorf("SpanRoute(%q) = %q, want %q", path, got, want)
		}
	}
	if got := EgressHosts(); !slices.Contains(got, "api.openai.com") || !slices.Contains(got, "api.anthropic.com") || got[len(got)-1] != "*.openai.azure.com" {
		t.Errorf("EgressHosts() = %v", got)
	}
}

// gen_ai.operation.name stays within the OTel well-known values (a
// bounded label): chat, text_completion, and other for unparsed routes
// and names that are no API.
func TestOperationIsBounded(t *testing.T) {
	want := map[Name]string{NameChat: "chat", NameResponses: "chat", NameMessages: "chat", NameOllamaChat: "chat", NameGemini: "chat",
		NameCompletions: "text_completion", NameOllamaGenerate: "text_completion", NameTGIGenerate: "text_completion",
		NameLlamaCppCompletion: "text_completion", NameUpgrade: "other", NameOther: "other", "anything": "other", "": "other"}
	for _, a := range APIs() {
		if _, ok := want[a.Name]; !ok {
			t.Errorf("%s: no operation expected", a.Name)
		}
	}
	for a, op := range want {
		if got := a.Operation(); got != op {
			t.Errorf("%s: operation %q, want %q", a, got, op)
		}
	}
}

// Each API's own rules: the finish reasons that mean "cut", the key
// header and its scheme, the engine headers read from which engine.
func TestAPIRules(t *testing.T) {
	for _, c := range []struct {
		api    *API
		reason string
		cut    bool
	}{
		{APIChat, "length", true}, {APIChat, "stop", false}, {APIChat, "max_tokens", false}, {APIChat, "", false},
		{APICompletions, "length", true}, {APICompletions, "limit", true},
		{APIResponses, "max_output_tokens", true}, {APIResponses, "completed", false},
		{APIMessages, "max_tokens", true}, {APIMessages, "end_turn", false}, {APIMessages, "length", false},
		{APIOllamaChat, "length", true}, {APIOllamaGenerate, "length", true}, {APIOllamaGenerate, "stop", false},
		{APITGIGenerate, "length", true}, {APITGIGenerate, "eos_token", false},
		{APILlamaCppCompletion, "limit", true}, {APILlamaCppCompletion, "eos", false},
		{APIGemini, "MAX_TOKENS", true}, {APIGemini, "max_tokens", false}, {APIGemini, "STOP", false},
		{APIOther, "length", false}, {APIUpgrade, "length", false},
	} {
		if got := c.api.CutBy(c.reason); got != c.cut {
			t.Errorf("%s.CutBy(%q) = %v", c.api.Name, c.reason, got)
		}
	}
	for _, c := range []struct {
		api         *API
		name, value string
	}{
		{APIChat, "Authorization", "Bearer k"}, {APICompletions, "Authorization", "Bearer k"},
		{APIMessages, "x-api-key", "k"}, {APIGemini, "x-goog-api-key", "k"},
		{APIOllamaChat, "Authorization", "Bearer k"}, {APITGIGenerate, "Authorization", "Bearer k"},
	} {
		if n, v := c.api.KeyHeader("k"); n != c.name || v != c.value {
			t.Errorf("%s: key header %s: %s, want %s: %s", c.api.Name, n, v, c.name, c.value)
		}
	}
	if !slices.Contains(APIMessages.ProbeHeaders, [2]string{"anthropic-version", "2023-06-01"}) {
		t.Errorf("Messages probe headers %v", APIMessages.ProbeHeaders)
	}
	for _, c := range []struct {
		api    *API
		engine string
		want   *EngineHeaders
	}{
		{APITGIGenerate, "", tgiHeaders}, {APITGIGenerate, EngineVLLM, tgiHeaders},
		{APIChat, EngineTGI, tgiHeaders}, {APIChat, "", nil}, {APIChat, EngineVLLM, nil},
		{APICompletions, EngineTGI, tgiHeaders}, {APIMessages, EngineTGI, nil}, {APIGemini, "", nil}, {APIOther, EngineTGI, nil},
	} {
		if got := c.api.HeadersFrom(c.engine); got != c.want {
			t.Errorf("%s.HeadersFrom(%q) = %v", c.api.Name, c.engine, got)
		}
	}
	if u := APIChat.Request.Usage; u == nil || u.Object != "stream_options" || u.Member != "include_usage" {
		t.Errorf("chat usage option %v", u)
	}
	for _, a := range []*API{APIResponses, APIMessages, APIOllamaChat, APITGIGenerate, APIGemini, APILlamaCppCompletion} {
		if a.Request.Usage != nil {
			t.Errorf("%s: a usage option", a.Name)
		}
	}
	if APIChat.Request.IgnoreEOS != "ignore_eos" || APIMessages.Request.IgnoreEOS != "" || APIGemini.Request.IgnoreEOS != "" {
		t.Errorf("ignore_eos members")
	}
}
