package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokentap/tokentap/internal/testtool"
)

// The body of the long requests: over twice the sidecar's default
// --peek-bytes (1 MiB), so that it is read in part. Design note: only
// promptBytes of it are prompt text; the rest is a "padding" member that
// Ollama ignores. Ollama tokenizes a prompt in time that grows with the
// square of its length with the test model (a 64 KiB prompt 1.4 s,
// 256 KiB 27 s, on this machine): a 2 MB prompt would take a quarter of
// an hour. The sidecar reads the first 1 MiB of any body the same way,
// whatever the members beyond it are, so what the test needs is the
// body's size and its order: stream after messages, past the peek.
const (
	bodyBytes   = 2 << 20
	promptBytes = 16 << 10
)

// longPrompt is n bytes of words.
func longPrompt(n int) string {
	const words = "lorem ipsum dolor sit amet "
	return strings.Repeat(words, n/len(words)+1)[:n]
}

// topKeys returns the top-level member names of a JSON object, in order.
func topKeys(body []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// A 2 MB request body sent as the real client libraries send it, with
// "stream" after "messages" (the OpenAI Go SDK writes stream after every
// other member; the Vercel AI SDK always after messages): the sidecar
// reads only its first 1 MiB, so the request's stream member is never
// read. The
// record must still say stream true (from the answer: Ollama's SSE),
// request_read partial, carry a TTFT, and the TTFT SLO must judge it
// (issue 20: such requests were recorded stream false, and every
// latency SLO counted them as not applicable).
func TestLongStreamedBodyThroughTheSDKs(t *testing.T) {
	w := setup(t)
	cfg := filepath.Join(t.TempDir(), "slo.yaml")
	if err := os.WriteFile(cfg, []byte("slo:\n  objectives:\n    - name: first-token\n      target: 0.9\n      thresholds:\n        ttft: 10m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startSidecar(t, w, "--config", cfg)
	const maxTokens = 12
	prompt := longPrompt(promptBytes)
	messages := []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt), openai.AssistantMessage("ok"),
		openai.UserMessage("Say something.")}

	check := func(t *testing.T, r rec, text string) {
		t.Helper()
		if r.API != "chat" || !r.Stream || r.Outcome != "success" || r.raw["request_read"] != "partial" {
			t.Fatalf("record api %q stream %v outcome %q request_read %v, want chat, true, success, partial: %s",
				r.API, r.Stream, r.Outcome, r.raw["request_read"], r)
		}
		if r.Model != modelName {
			t.Errorf("record model %q, want %q (the response's, when the request's was not read)", r.Model, modelName)
		}
		if r.TTFTms == nil || r.TokenEvents == 0 {
			t.Fatalf("record ttft_ms %v, %d token events: want a TTFT: %s", r.TTFTms, r.TokenEvents, r)
		}
		var verdicts []struct {
			Name          string   `json:"name"`
			Qualified     bool     `json:"qualified"`
			Failed        []string `json:"failed"`
			NotApplicable []string `json:"not_applicable"`
		}
		b, _ := json.Marshal(r.raw["slo"])
		if err := json.Unmarshal(b, &verdicts); err != nil || len(verdicts) != 1 || verdicts[0].Name != "first-token" ||
			slices.Contains(verdicts[0].NotApplicable, "ttft") || !verdicts[0].Qualified {
			t.Fatalf("verdicts %s: want first-token judged on its TTFT and met (10 min)", b)
		}
		if text == "" {
			t.Errorf("the SDK assembled no text")
		}
		t.Logf("record: ttft_ms %.1f e2e_ms %.1f token_events %d output_tokens %v", *r.TTFTms, fderef(r.E2Ems), r.TokenEvents, deref(r.OutputTokens))
	}

	t.Run("openai-go", func(t *testing.T) {
		var keys []string
		var size int
		capture := func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return nil, err
			}
			req.Body = io.NopCloser(bytes.NewReader(b))
			size = len(b)
			keys, err = topKeys(b)
			if err != nil {
				return nil, err
			}
			return next(req)
		}
		c := openai.NewClient(option.WithBaseURL(s.proxy+"/v1/"), option.WithAPIKey("ollama"), option.WithMaxRetries(0),
			option.WithMiddleware(capture), option.WithJSONSet("padding", longPrompt(bodyBytes)))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		p, err := chatStream(ctx, c, openai.ChatCompletionNewParams{
			Model:       modelName,
			Messages:    messages,
			MaxTokens:   openai.Int(maxTokens),
			Temperature: openai.Float(0),
			Seed:        openai.Int(seed),
		})
		r := s.next(t)
		if err != nil {
			t.Fatalf("the SDK: %v (record %s)", err, r)
		}
		t.Logf("the SDK sent %d bytes, members %q", size, keys)
		if size < bodyBytes || len(keys) == 0 || keys[len(keys)-1] != "stream" || slices.Index(keys, "messages") > slices.Index(keys, "stream") {
			t.Fatalf("the SDK sent %d bytes with members %q: the test needs a body over 2 MiB with stream after messages", size, keys)
		}
		check(t, r, p.Text)
	})

	t.Run("vercel-ai", func(t *testing.T) {
		node, dir := nodePackage(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "longbody.mjs", s.proxy+"/v1", modelName, strconv.Itoa(promptBytes), strconv.Itoa(bodyBytes), strconv.Itoa(maxTokens))
		cmd.Dir, cmd.Env = dir, cleanEnv()
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		r := s.next(t)
		if err != nil {
			t.Fatalf("node longbody.mjs: %v\n%s\nrecord %s", err, stderr.String(), r)
		}
		var res struct {
			Text         string   `json:"text"`
			FinishReason string   `json:"finishReason"`
			Keys         []string `json:"keys"`
			BodyBytes    int      `json:"bodyBytes"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("node's output %q: %v", out, err)
		}
		t.Logf("the AI SDK sent %d bytes, members %q; finish %q", res.BodyBytes, res.Keys, res.FinishReason)
		if res.BodyBytes < bodyBytes || slices.Index(res.Keys, "stream") < slices.Index(res.Keys, "messages") ||
			!slices.Contains(res.Keys, "messages") {
			t.Fatalf("the AI SDK sent %d bytes with members %q: the test needs a body over 2 MiB with stream after messages", res.BodyBytes, res.Keys)
		}
		check(t, r, res.Text)
	})
}

// nodePackage returns node and the folder of the Node client libraries
// (enginetest/node), installed: `npm ci` from its package-lock.json when
// node_modules is missing. A missing node or npm skips the test, or fails
// it with CI=true (testtool.Need).
func nodePackage(t *testing.T) (node, dir string) {
	t.Helper()
	node = testtool.Need(t, "node")
	npm := testtool.Need(t, "npm")
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err == nil {
		return node, dir
	}
	// The registry is reached with the machine's own settings (its proxy
	// included): this installs the client, it measures nothing.
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return node, dir
}
