package simengine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokentap/tokentap/stream"
)

// Server serves the engine over HTTP: POST /v1/chat/completions,
// POST /v1/completions (with or without the /v1 prefix), GET /health,
// GET /v1/models, and GET /metrics (vLLM's metric names, in the
// Prometheus text format). Wire formats follow vLLM's (see
// ../shared/research/engine-wire-formats-and-metrics.md §A1): a role chunk
// with the first token, finish_reason on the last content chunk, the
// usage chunk with "choices":[] when asked, "data: [DONE]", and an error
// object as a data event after HTTP 200 for a mid-stream failure.
//
// Every request the engine accepts has an ID in its ground truth
// (Engine.Truth): the client's X-Request-Id when usable, else the
// engine's own; the response says it in X-Sim-Request-Id. A request on a
// connection Engine.Dialer made slow, the first on it, has that delay in
// its truth.
type Server struct {
	Engine  *Engine
	seq     atomic.Uint64
	now     func() time.Time
	metrics http.Handler
}

// NewServer returns a server for e.
func NewServer(e *Engine) *Server {
	return &Server{Engine: e, now: time.Now, metrics: promhttp.HandlerFor(e.Registry(), promhttp.HandlerOpts{})}
}

type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              bool            `json:"stream"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// promptTokens estimates a prompt's length as a tokenizer would roughly
// count it: one token per 4 bytes of text plus 4 per message. With the
// prefix cache on, the count is the capture's instead (prefixKeys).
func (r *chatRequest) promptTokens() int {
	n := 0
	for _, m := range r.Messages {
		n += 4 + len(m.Content)/4
	}
	n += len(r.Prompt) / 4
	return max(n, 1)
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case p == "/health" || p == "/v1/health":
		w.WriteHeader(http.StatusOK)
	case p == "/metrics" && r.Method == http.MethodGet:
		s.metrics.ServeHTTP(w, r)
	case strings.HasSuffix(p, "/models") && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":"tokentap"}]}`, s.Engine.cfg.Model)
	case strings.HasSuffix(p, "/chat/completions") && r.Method == http.MethodPost:
		s.complete(w, r, true)
	case strings.HasSuffix(p, "/completions") && r.Method == http.MethodPost:
		s.complete(w, r, false)
	default:
		writeError(w, http.StatusNotFound, "NotFoundError", "no such route: "+r.URL.Path)
	}
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
	w.Write(append(b, '\n'))
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		return
	}
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON: "+err.Error())
		return
	}
	maxTokens := s.Engine.cfg.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if maxTokens < 1 {
		writeError(w, http.StatusBadRequest, "BadRequestError", "max_tokens must be at least 1")
		return
	}
	model := req.Model
	if model == "" {
		model = s.Engine.cfg.Model
	}
	prompt := req.promptTokens()
	var keys []uint64
	if e := s.Engine; e.cache != nil { // the capture's tokens and blocks (prefix.go)
		api := stream.Name(stream.NameCompletions)
		if chat {
			api = stream.NameChat
		}
		prompt, keys = prefixKeys(e.seed, body, api, e.cfg.PrefixCacheBlockTokens, e.cfg.KVCapacityTokens)
	}
	if prompt >= s.Engine.cfg.KVCapacityTokens {
		writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("the prompt (%d tokens) does not fit the KV cache (%d tokens)", prompt, s.Engine.cfg.KVCapacityTokens))
		return
	}
	q := request{prompt: prompt, keys: keys, maxTokens: maxTokens, ignoreEOS: req.IgnoreEOS, conn: s.Engine.takeDial(r.RemoteAddr)}
	if id := r.Header.Get("X-Request-Id"); validRequestID(id) {
		q.id = id
	}
	sq, ok := s.Engine.submitRequest(r.Context(), q)
	if !ok {
		st := s.Engine.cfg.RejectStatus
		writeError(w, st, "overloaded", "the engine's waiting queue is full")
		return
	}
	w.Header().Set("X-Sim-Request-Id", sq.truth.ID)
	id := "cmpl-sim-" + strconv.FormatUint(s.seq.Add(1), 10)
	if chat {
		id = "chatcmpl-sim-" + strconv.FormatUint(s.seq.Load(), 10)
	}
	created := s.now().Unix()
	if !req.Stream {
		s.whole(w, sq, chat, id, model, created, prompt)
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	s.stream(w, sq, chat, id, model, created, prompt, includeUsage)
}

func (s *Server) stream(w http.ResponseWriter, sq *seq, chat bool, id, model string, created int64, prompt int, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	head := fmt.Sprintf(`{"id":%q,"object":%q,"created":%d,"model":%q,"choices":[`, id, object, created, model)
	var buf []byte
	n, first := 0, true
	for ev := range sq.out {
		buf = buf[:0]
		if first && chat {
			buf = append(buf, "data: "+head+`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		first = false
		text := ""
		for _, t := range ev.tokens {
			text += vocabulary[t]
		}
		n += len(ev.tokens)
		if ev.err {
			if len(ev.tokens) > 0 {
				buf = appendChunk(buf, head, chat, text, "")
			}
			buf = append(buf, `data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`+"\n\ndata: [DONE]\n\n"...)
			w.Write(buf)
			return
		}
		buf = appendChunk(buf, head, chat, text, ev.finish)
		if ev.finish != "" && includeUsage {
			buf = fmt.Appendf(buf, `data: {"id":%q,"object":%q,"created":%d,"model":%q,"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n",
				id, object, created, model, prompt, prompt+n, n)
		}
		if ev.finish != "" {
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
	}
}

func appendChunk(buf []byte, head string, chat bool, text, finish string) []byte {
	fr := "null"
	if finish != "" {
		fr = strconv.Quote(finish)
	}
	q, _ := json.Marshal(text)
	buf = append(buf, "data: "+head...)
	if chat {
		buf = fmt.Appendf(buf, `{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":%s}]}`, q, fr)
	} else {
		buf = fmt.Appendf(buf, `{"index":0,"text":%s,"logprobs":null,"finish_reason":%s}]}`, q, fr)
	}
	return append(buf, "\n\n"...)
}

func (s *Server) whole(w http.ResponseWriter, sq *seq, chat bool, id, model string, created int64, prompt int) {
	var sb strings.Builder
	n, finish := 0, ""
	for ev := range sq.out {
		if ev.err {
			writeError(w, http.StatusInternalServerError, "InternalServerError", "Internal server error")
			return
		}
		for _, t := range ev.tokens {
			sb.WriteString(vocabulary[t])
		}
		n += len(ev.tokens)
		finish = ev.finish
	}
	if finish == "" { // the request was cancelled
		return
	}
	text, _ := json.Marshal(sb.String())
	w.Header().Set("Content-Type", "application/json")
	usage := fmt.Sprintf(`"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}`, prompt, prompt+n, n)
	if chat {
		fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%s},"logprobs":null,"finish_reason":%q}],%s}`,
			id, created, model, text, finish, usage)
	} else {
		fmt.Fprintf(w, `{"id":%q,"object":"text_completion","created":%d,"model":%q,"choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":%q}],%s}`,
			id, created, model, text, finish, usage)
	}
}
