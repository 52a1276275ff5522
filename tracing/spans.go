package tracing

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokentap/tokentap/internal/safe"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Each understood request gets two spans: a SERVER span "{method}
// {route}" for the hop through the sidecar and, under it, the CLIENT
// span "{gen_ai.operation.name} {gen_ai.request.model}", the GenAI
// inference span, whose context goes upstream; both end at the record's
// terminal instant (why two: docs/tracing.md, "Spans"). Every string a
// client or an engine chose goes through safe.String: the OTLP exporter
// refuses a whole batch over one attribute that is not valid UTF-8.

// Options configure a Tracer.
type Options struct {
	// Provider creates the spans; nil disables tracing.
	Provider trace.TracerProvider
	// Propagator extracts the client's context and injects ours upstream;
	// nil means W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
	// ProviderName is gen_ai.provider.name; empty means
	// "openai_compatible". The conventions treat it as the telemetry
	// flavour: "openai" promises the openai.* attributes too; see
	// docs/tracing.md.
	ProviderName string
	// Capture, when non-nil, records prompt and completion text on the
	// inference span (opt-in: pre-production use).
	Capture *ContentCapture
	// StallThreshold marks gaps above it as stall events on the span;
	// zero adds none.
	StallThreshold time.Duration
}

// MaxStallEvents caps the stall events on one span; the count of all
// stalls is an attribute (tokentap.stalls) regardless.
const MaxStallEvents = 64

// Tracer starts and ends the spans of requests. A nil *Tracer traces
// nothing; every method is safe on it.
type Tracer struct {
	opts   Options
	tracer trace.Tracer
}

// New returns a Tracer, or nil when opts.Provider is nil.
func New(opts Options) *Tracer {
	if opts.Provider == nil {
		return nil
	}
	if opts.Propagator == nil {
		opts.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	if opts.ProviderName == "" {
		opts.ProviderName = "openai_compatible"
	}
	return &Tracer{opts: opts, tracer: opts.Provider.Tracer("github.com/tokentap/tokentap/tracing")}
}

// Capturing reports whether content capture is on (the proxy then keeps
// the request body and the response bytes, bounded).
func (t *Tracer) Capturing() bool { return t != nil && t.opts.Capture != nil }

// Inject writes ctx's span context into an upstream request's headers:
// our client span replaces the client's traceparent (which is its
// parent's), so the engine's spans join under it.
func (t *Tracer) Inject(ctx context.Context, h http.Header) {
	if t != nil {
		t.opts.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// ContentCapture is the opt-in content capture of the conventions.
//
// The zero value truncates at 4096 bytes and redacts nothing.
type ContentCapture struct {
	MaxBytes int              // per attribute, after redaction; 0 means 4096
	Redact   []*regexp.Regexp // each match is replaced by "[REDACTED]"
}

// DefaultRedactions returns the patterns always applied to captured
// content: API keys of any realistic length (sk-…, sk-ant-…, sk-proj-…),
// bearer tokens, JWTs, AWS access key ids and e-mail addresses. Each call
// returns a new slice.
func DefaultRedactions() []*regexp.Regexp {
	return []*regexp.Regexp{
		regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{8,}`),
		regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{8,}=*`),
		regexp.MustCompile(`\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*`),
		regexp.MustCompile(`\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`),
		regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}`),
	}
}

func (c *ContentCapture) clean(s string) string {
	for _, re := range c.Redact {
		s = re.ReplaceAllString(s, "[REDACTED]")
	}
	max := c.MaxBytes
	if max <= 0 {
		max = 4096
	}
	if len(s) > max {
		cut := max
		for cut > 0 && (s[cut]&0xC0) == 0x80 { // keep UTF-8 whole
			cut--
		}
		s = s[:cut] + "…[truncated]"
	}
	return s
}

// Spans are one request's two spans. A nil *Spans is a request that is
// not traced.
type Spans struct {
	t              *Tracer
	server, client trace.Span
	params         pipeline.Params
	body           []byte // the request body, kept only for content capture
}

// Start opens the two spans at the record's arrival and returns the
// context the upstream request must carry, and the spans (a *Spans; nil
// on a nil Tracer). It sets rec.TraceID and rec.SpanID when the request
// is sampled. body is kept only when content capture is on.
func (t *Tracer) Start(ctx context.Context, r *http.Request, rec *record.Record, upstream *url.URL, p pipeline.Params, body []byte) (context.Context, pipeline.Spans) {
	if t == nil {
		return ctx, nil
	}
	ctx = t.opts.Propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
	method, path, model := safe.String(r.Method, 0), safe.String(r.URL.Path, 0), safe.String(rec.Model, 0)
	ctx, server := t.tracer.Start(ctx, method+" "+stream.SpanRoute(path), trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(rec.Arrive),
		trace.WithAttributes(attribute.String("http.request.method", method), attribute.String("url.path", path)))
	op := rec.API.Operation()
	name := op
	if model != "" {
		name += " " + model
	}
	port, _ := strconv.Atoi(upstream.Port())
	if port == 0 {
		port = 80
		if upstream.Scheme == "https" {
			port = 443
		}
	}
	start := []attribute.KeyValue{ // set at start: samplers may use them
		attribute.String("gen_ai.operation.name", op),
		attribute.String("gen_ai.provider.name", t.opts.ProviderName),
		attribute.String("server.address", safe.String(upstream.Hostname(), 0)),
		attribute.Int("server.port", port),
	}
	if model != "" {
		start = append(start, attribute.String("gen_ai.request.model", model))
	}
	ctx, client := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(rec.Arrive), trace.WithAttributes(start...))
	s := &Spans{t: t, server: server, client: client, params: p}
	if t.opts.Capture != nil {
		s.body = body
	}
	if sc := client.SpanContext(); sc.IsSampled() {
		rec.TraceID, rec.SpanID = sc.TraceID().String(), sc.SpanID().String()
	}
	return ctx, s
}

// upstreamAttr names each connection phase's attribute:
// tokentap.upstream.<phase>, in seconds.
var upstreamAttr = func() map[uint8]string {
	m := make(map[uint8]string, len(record.UpstreamPhases))
	for _, p := range record.UpstreamPhases {
		m[p.Bit] = "tokentap.upstream." + p.Name
	}
	return m
}()

// End sets the attributes known from the finished record and closes both
// spans at its terminal instant (their true end, whenever End is called).
// captured is the response body kept for content capture, or nil.
func (s *Spans) End(rec *record.Record, captured []byte) {
	if s == nil {
		return
	}
	end := rec.Terminal
	if end.IsZero() {
		end = time.Now()
	}
	a := []attribute.KeyValue{}
	add := func(kv ...attribute.KeyValue) { a = append(a, kv...) }
	if rec.Stream {
		add(attribute.Bool("gen_ai.request.stream", true))
	}
	p := s.params
	if p.MaxTokens > 0 {
		add(attribute.Int64("gen_ai.request.max_tokens", p.MaxTokens))
	}
	if p.Temperature != nil {
		add(attribute.Float64("gen_ai.request.temperature", *p.Temperature))
	}
	if p.TopP != nil {
		add(attribute.Float64("gen_ai.request.top_p", *p.TopP))
	}
	if p.Seed != nil {
		add(attribute.Int64("gen_ai.request.seed", *p.Seed))
	}
	if rec.ResponseModel != "" {
		add(attribute.String("gen_ai.response.model", safe.String(rec.ResponseModel, 0)))
	}
	if rec.ResponseID != "" {
		add(attribute.String("gen_ai.response.id", safe.String(rec.ResponseID, 0)))
	}
	switch {
	case rec.Outcome != record.Success && rec.Stream && rec.TokenEvents() > 0:
		add(attribute.StringSlice("gen_ai.response.finish_reasons", []string{"error"})) // ended early
	case rec.FinishReason != "" || len(rec.Choices) > 0: // one per choice
		reasons := rec.FinishReasons()
		for i := range reasons {
			reasons[i] = safe.String(reasons[i], 0)
		}
		add(attribute.StringSlice("gen_ai.response.finish_reasons", reasons))
	}
	if rec.InputTokens >= 0 {
		add(attribute.Int64("gen_ai.usage.input_tokens", rec.InputTokens))
	}
	if rec.OutputTokens >= 0 {
		add(attribute.Int64("gen_ai.usage.output_tokens", rec.OutputTokens))
	}
	if rec.CachedTokens > 0 {
		add(attribute.Int64("gen_ai.usage.cache_read.input_tokens", rec.CachedTokens))
	}
	secs := func(name string, d time.Duration, ok bool) {
		if ok {
			add(attribute.Float64(name, d.Seconds()))
		}
	}
	d, ok := rec.TTFT()
	if rec.Stream {
		secs("gen_ai.response.time_to_first_chunk", d, ok)
	}
	secs("tokentap.ttft", d, ok)
	d, ok = rec.TTFOT()
	secs("tokentap.ttfot", d, ok)
	d, ok = rec.TPOT()
	secs("tokentap.tpot", d, ok)
	d, ok = rec.E2E()
	secs("tokentap.e2e", d, ok)
	d, ok = rec.MaxITL()
	secs("tokentap.max_itl", d, ok)
	if u := &rec.Upstream; u.Asked {
		// The connection phases (docs/tracing.md): the OTel HTTP span
		// conventions define none, so they are tokentap's, one attribute
		// each, on the span whose keep decision they share.
		if u.Known&record.UpConnWait != 0 {
			add(attribute.Bool("tokentap.upstream.reused", u.Reused))
		}
		for _, p := range record.UpstreamPhases {
			d, ok = u.Phase(p.Bit)
			secs(upstreamAttr[p.Bit], d, ok)
		}
	}
	add(attribute.String("tokentap.outcome", string(rec.Outcome)),
		attribute.String("tokentap.token_source", rec.TokenSource),
		attribute.String("tokentap.traffic", rec.Traffic),
		attribute.Int("tokentap.stalls", rec.Stalls),
		attribute.String("tokentap.record_id", rec.ID))
	if rec.Tenant != "" { // the bounded label, never the key or header value (docs/tracing.md)
		add(attribute.String("tokentap.tenant", rec.Tenant))
	}
	if rec.EnergySource != "" {
		add(attribute.Float64("tokentap.energy_j", rec.EnergyJ),
			attribute.Float64("tokentap.energy_dynamic_j", rec.EnergyDynamicJ),
			attribute.String("tokentap.energy_source", rec.EnergySource))
	}
	if rec.PreemptionsDuring >= 0 {
		add(attribute.Int("tokentap.preemptions_during", rec.PreemptionsDuring))
	}
	if rec.StallCause != "" {
		add(attribute.String("tokentap.stall_cause", rec.StallCause))
	}
	if len(rec.Causes) > 0 { // why it was slow: "what:cause" per slow event, in time order (docs/tracing.md)
		whys := make([]string, len(rec.Causes))
		for i, c := range rec.Causes {
			whys[i] = c.What + ":" + c.Cause
		}
		add(attribute.StringSlice("tokentap.slow.causes", whys))
	}
	if len(rec.SLO) > 0 {
		qualified := true
		var failed []string
		for _, v := range rec.SLO {
			if !v.Excluded && !v.Qualified {
				qualified = false
				for _, f := range v.Failed {
					failed = append(failed, v.Name+":"+f)
				}
			}
		}
		add(attribute.Bool("tokentap.slo.qualified", qualified))
		s.server.SetAttributes(attribute.Bool("tokentap.slo.qualified", qualified)) // same keep decision
		if len(failed) > 0 {
			add(attribute.StringSlice("tokentap.slo.failed", failed))
		}
	}
	if c := s.t.opts.Capture; c != nil {
		var tx stream.Text
		if a := rec.API.API(); a != nil {
			tx = a.Request.Text
		}
		msgs, system := inputMessages(s.body, tx, c)
		if msgs != "" {
			add(attribute.String("gen_ai.input.messages", msgs))
		}
		if system != "" {
			add(attribute.String("gen_ai.system_instructions", system))
		}
		if captured != nil {
			text := c.clean(stream.AnswerTextOf(stream.FormatOfAPI(rec.API), captured, rec.Stream))
			out, _ := json.Marshal([]map[string]any{{"role": "assistant", "parts": []map[string]string{{"type": "text", "content": text}},
				"finish_reason": safe.String(rec.FinishReason, 0)}})
			add(attribute.String("gen_ai.output.messages", string(out)))
		}
	}
	cl := s.client
	if rec.ErrorType != "" {
		add(attribute.String("error.type", rec.ErrorType))
		cl.SetStatus(codes.Error, rec.ErrorType)
		s.server.SetAttributes(attribute.String("error.type", rec.ErrorType))
		s.server.SetStatus(codes.Error, rec.ErrorType)
	}
	cl.SetAttributes(a...)
	if !rec.FirstToken.IsZero() {
		var attrs []attribute.KeyValue
		if len(rec.Causes) > 0 && rec.Causes[0].What == "ttft" {
			attrs = causeAttrs(attrs, &rec.Causes[0])
		}
		cl.AddEvent("gen_ai.first_token", trace.WithTimestamp(rec.FirstToken), trace.WithAttributes(attrs...))
	}
	if th := s.t.opts.StallThreshold; th > 0 {
		n, j := 0, 0 // j: the next stall cause to match, by its start
		for i := 1; i < len(rec.TokenAt) && n < MaxStallEvents; i++ {
			if gap := rec.TokenAt[i] - rec.TokenAt[i-1]; gap > th {
				attrs := []attribute.KeyValue{attribute.Float64("tokentap.gap", gap.Seconds())}
				if rec.PreemptionsDuring >= 0 { // the request's count: the engine's counter is not per stall
					attrs = append(attrs, attribute.Int("tokentap.preemptions_during", rec.PreemptionsDuring))
				}
				start := rec.Arrive.Add(rec.TokenAt[i-1])
				for j < len(rec.Causes) && (rec.Causes[j].What != "stall" || rec.Causes[j].At.Before(start)) {
					j++
				}
				if j < len(rec.Causes) && rec.Causes[j].At.Equal(start) {
					attrs = causeAttrs(attrs, &rec.Causes[j])
				}
				cl.AddEvent("tokentap.stall", trace.WithTimestamp(rec.Arrive.Add(rec.TokenAt[i])), trace.WithAttributes(attrs...))
				n++
			}
		}
	}
	if rec.HTTPStatus != 0 {
		s.server.SetAttributes(attribute.Int("http.response.status_code", rec.HTTPStatus))
	}
	cl.End(trace.WithTimestamp(end))
	s.server.End(trace.WithTimestamp(end))
}

// causeAttrs adds a slow event's cause to its span event: the cause, the
// milliseconds it explains, and the record id it points to (never
// content).
func causeAttrs(attrs []attribute.KeyValue, c *record.Cause) []attribute.KeyValue {
	attrs = append(attrs, attribute.String("tokentap.slow.cause", c.Cause), attribute.Float64("tokentap.slow.cause_ms", c.Ms))
	if c.Ref != "" {
		attrs = append(attrs, attribute.String("tokentap.slow.ref", c.Ref))
	}
	return attrs
}

// part and message are the conventions' message parts and messages
// (gen_ai.input.messages, gen_ai.system_instructions).
type part struct {
	Type    string `json:"type"`
	Content string `json:"content"`
}

type message struct {
	Role  string `json:"role"`
	Parts []part `json:"parts"`
}

// inputMessages renders the request's text where its API's description
// says it lives (stream.Request.Text), redacted and truncated: its
// conversation and prompts in the conventions' gen_ai.input.messages
// form, and its system text (a member beside the conversation) as
// gen_ai.system_instructions' parts; "" for either when the body has
// none. Roles are kept as the API names them.
func inputMessages(body []byte, tx stream.Text, c *ContentCapture) (input, system string) {
	var req map[string]json.RawMessage
	if len(body) == 0 || json.Unmarshal(body, &req) != nil {
		return "", ""
	}
	var out []message
	if raw := req[tx.Messages]; tx.Messages != "" && len(raw) > 0 {
		var msgs []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Parts   json.RawMessage `json:"parts"`
		}
		json.Unmarshal(raw, &msgs)
		for _, m := range msgs {
			content := m.Content
			if tx.Parts {
				content = m.Parts
			}
			out = append(out, message{m.Role, textParts(content, c, 0)})
		}
	}
	for _, k := range tx.Prompt {
		if raw := req[k]; len(raw) > 0 {
			out = append(out, message{"user", textParts(raw, c, 0)})
		}
	}
	var sys []part
	for _, k := range tx.System {
		if raw := req[k]; len(raw) > 0 {
			sys = append(sys, textParts(raw, c, 0)...)
		}
	}
	if len(out) > 0 {
		b, _ := json.Marshal(out)
		input = string(b)
	}
	if len(sys) > 0 {
		b, _ := json.Marshal(sys)
		system = string(b)
	}
	return input, system
}

// maxPartDepth bounds how deep textParts looks into nested lists and
// objects (a block list in a message in a list: 3); deeper content is
// kept as its JSON text, so that a hostile nesting costs one decode a
// level for a few levels, not one for each of thousands.
const maxPartDepth = 4

// textParts reads content as text parts: a string is one; a list is its
// elements' parts; an object's "parts" or "text" member is read (a
// content block, a message with parts); anything else, or anything
// nested deeper than maxPartDepth, is kept as its JSON text. Each is
// cleaned.
func textParts(raw json.RawMessage, c *ContentCapture, depth int) []part {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []part{{"text", c.clean(s)}}
	}
	if depth >= maxPartDepth {
		return []part{{"text", c.clean(string(raw))}}
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		var ps []part
		for _, e := range list {
			ps = append(ps, textParts(e, c, depth+1)...)
		}
		return ps
	}
	var obj struct {
		Parts json.RawMessage `json:"parts"`
		Text  *string         `json:"text"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		switch {
		case len(obj.Parts) > 0:
			return textParts(obj.Parts, c, depth+1)
		case obj.Text != nil:
			return []part{{"text", c.clean(*obj.Text)}}
		}
	}
	if string(raw) == "null" || len(raw) == 0 {
		return nil
	}
	return []part{{"text", c.clean(string(raw))}} // structured content: kept as its JSON text
}
