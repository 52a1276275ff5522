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
