// Package enginetest runs tokentap in front of a real inference engine and
// checks it against the engine's own answers. It holds tests only.
//
// The engine is Ollama v0.17.4, built from its Go module by
// scripts/install-test-tools.sh (pinned in tools/ollama/go.mod), serving a
// tiny random-weight llama model that the tests write themselves
// (internal/gguf: no download). Ollama listens on a free 127.0.0.1 port
// with its models in a temporary folder; the sidecar is the real binary,
// built from ./cmd/sidecar, started with --upstream pointing at it and
// --records into a temporary file. Nothing leaves 127.0.0.1.
//
// Every wire format Ollama serves is driven, raw and through the official
// Go SDKs: OpenAI Chat Completions and Completions (streamed and not, with
// and without the client's own usage request), the Responses API
// (/v1/responses), Anthropic's Messages API (/v1/messages), and Ollama's
// native /api/chat and /api/generate (NDJSON). For each, the client's
// bytes through the sidecar equal a direct request's (same seed,
// temperature 0; masks_test.go lists exactly what is masked and why), the
// record's token counts equal Ollama's, and the record's TTFT and E2E are
// within a stated bound of this client's own clock (formats_test.go says
// how the clocks are aligned).
//
// One test drives a Node client too: the Vercel AI SDK (`ai` and
// `@ai-sdk/openai-compatible`, exact versions in node/package.json and
// node/package-lock.json), through node/longbody.mjs. The test runs
// `npm ci` in node/ when node_modules is missing (the only step that
// reaches past 127.0.0.1: the npm registry, with the machine's own
// settings); a missing node or npm skips it, or fails it with CI=true.
//
// One test needs no engine: Google's Gen AI Go SDK (google.golang.org/genai)
// drives the Gemini API through the sidecar's egress proxy (--egress-listen)
// against a loopback TLS upstream named localhost that plays
// generativelanguage.googleapis.com (gemini_test.go).
//
// This is a module of its own (go.mod, with a replace directive to the
// main module) so that the SDKs stay out of tokentap's go.mod.
// scripts/test.sh runs its tests with CI=true: a missing ollama fails them
// there (internal/testtool); a plain `go test ./...` in this folder skips
// them, loudly, when ollama is not on PATH. ENGINETEST_OLLAMA_LOG=1 prints
// Ollama's log at the end.
package enginetest
