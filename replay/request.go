package replay

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/tokentap/tokentap/proxy"
	"github.com/tokentap/tokentap/stream"
	"github.com/tokentap/tokentap/workload"
)

// call is one replayed request, built before its instant.
type call struct {
	req    workload.Request
	api    *stream.API
	model  string
	stream bool
	path   string
	body   []byte
	// want is the output tokens asked for (max_tokens), -1 when the
	// line gave no output_length.
	want int64
	// px and hreq are the proxy (the Runner's, for the line's API) and
	// the request, made before the instant (Runner.prepare); out is what
	// the send leaves.
	px   *proxy.Proxy
	hreq *http.Request
	out  *sendState
}

// builder turns trace lines into requests.
type builder struct {
	api       *stream.API // when the line names none
	model     string      // overrides the line's
	stream    bool        // when the line does not say
	ignoreEOS bool
	prompts   *prompts
}

// build makes the request of a trace line: its API (the line's
// tokentap.api when the replay speaks it, else the default), its model,
// a prompt of input_length tokens, max_tokens = output_length.
func (b *builder) build(req workload.Request) (call, error) {
	c := call{req: req, api: b.api, want: -1}
	streamed := b.stream
	model := b.model
	var blockSize int64 // the capture's own, when the line says
	if m := req.Tokentap; m != nil {
		blockSize = m.BlockSize
		if a := stream.LookupAPI(m.API); a != nil && a.Probe != nil {
			c.api = a
		}
		if m.API != "" {
			streamed = m.Stream
		}
		if model == "" {
			model = m.Model
		}
	}
	if model == "" {
		return c, errors.New("no model: the line names none (tokentap.model); give --model")
	}
	text := req.Text
	if text == "" {
		n := req.InputLength
		if c.api.Operation == stream.OpChat {
			n -= ChatOverheadTokens
		}
		text = b.prompts.text(&req, max(n, 1), blockSize)
	}
	maxTokens := 0
	if req.HasOutputLength {
		c.want = max(req.OutputLength, 1) // no engine accepts a limit of 0
		maxTokens = int(c.want)
	}
	path, m := c.api.Probe(stream.ProbeParams{Model: model, Prompt: text, MaxTokens: maxTokens, Seed: req.Line, Stream: streamed})
	if !req.HasOutputLength {
		for _, k := range c.api.Request.MaxTokens {
			deletePath(m, k)
		}
	} else if k := c.api.Request.IgnoreEOS; k != "" && b.ignoreEOS {
		// The API's member that makes the engine generate exactly the
		// limit (docs/capture.md, "Replay"); an API without one has a
		// cap, and its answers may be shorter.
		m[k] = true
	}
	var err error
	c.path, c.model, c.stream = path, model, streamed
	c.body, err = json.Marshal(m)
	return c, err
}

// deletePath removes the member at a dotted path ("options.num_predict").
func deletePath(m map[string]any, path string) {
	head, rest, nested := strings.Cut(path, ".")
	if !nested {
		delete(m, head)
		return
	}
	if sub, ok := m[head].(map[string]any); ok {
		deletePath(sub, rest)
	}
}
