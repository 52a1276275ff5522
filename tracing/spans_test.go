package tracing

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tokentap/tokentap/config"
	"github.com/tokentap/tokentap/pipeline"
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// otlpReceiver is an OTLP/HTTP endpoint that counts the trace exports it
// received and answers each with 200.
type otlpReceiver struct {
	srv     *httptest.Server
	exports atomic.Int64
}

func newReceiver(t *testing.T) *otlpReceiver {
	o := &otlpReceiver{}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); r.URL.Path == "/v1/traces" && len(b) > 0 {
			o.exports.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(o.srv.Close)
	return o
}

// setup runs Setup with OTLP/HTTP traces to recv and the structured log
// in buf.
func setup(t *testing.T, recv *otlpReceiver, buf *bytes.Buffer, reg prometheus.Registerer) *Providers {
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.srv.URL)
	o, err := Setup(context.Background(), config.Tracing{}, nil, reg, slog.New(slog.NewJSONHandler(buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func unsafeRune(r rune) bool {
	return r < 0x20 || r >= 0x7f && r <= 0x9f || r == '\u2028' || r == '\u2029'
}

// Strings a client or an engine chose reach the spans valid UTF-8, with
// no control characters, at most 256 bytes: the OTLP exporter sends the
// batch (it refuses a whole batch over one invalid string) and reports
// no error.
func TestHostileStringsInSpans(t *testing.T) {
	recv := newReceiver(t)
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	o := setup(t, recv, &buf, reg)
	spans := tracetest.NewSpanRecorder()
	o.Traces.RegisterSpanProcessor(spans)
	tr := New(Options{Provider: o.Traces})

	rec := record.New(2)
	rec.Arrive = time.Now()
	rec.API, rec.Traffic, rec.Outcome = stream.NameOther, "live", record.Success
	rec.SetModel("m\r\n\x1b[31m\xff")
	// An engine's model of 3-byte characters, cut at 256 bytes inside one
	// (as the tap keeps it), and an id with NUL and U+2028.
	rec.ResponseModel = strings.Repeat("模", 100)[:record.MaxModelBytes]
	rec.ResponseID, rec.FinishReason = "id\x00\u2028\xfe", "stop\u0085"
	rec.Terminal = rec.Arrive.Add(time.Millisecond)
	r := httptest.NewRequest("POST", "/v1/x", nil)
	r.URL.Path = "/v1/\xff\r\nHost: evil"
	_, s := tr.Start(context.Background(), r, rec, &url.URL{Scheme: "http", Host: "engine:8000"}, pipeline.Params{}, nil)
	s.End(rec, nil)
	if err := o.Shutdown(context.Background()); err != nil {
		t.Fatalf("export: %v", err)
	}

	ended := spans.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans", len(ended))
	}
	check := func(what, v string) {
		if !utf8.ValidString(v) || strings.IndexFunc(v, unsafeRune) >= 0 || len(v) > 256 {
			t.Errorf("%s = %q: invalid UTF-8, a control character or over 256 bytes", what, v)
		}
	}
	got := map[string]string{}
	for _, sp := range ended {
		check("span name", sp.Name())
		got[sp.SpanKind().String()] = sp.Name()
		for _, kv := range sp.Attributes() {
			var vs []string
			switch kv.Value.Type() {
			case attribute.STRING:
				vs = []string{kv.Value.AsString()}
			case attribute.STRINGSLICE:
				vs = kv.Value.AsStringSlice()
			}
			for _, v := range vs {
				check(string(kv.Key), v)
				got[string(kv.Key)] = v
			}
		}
	}
	for k, want := range map[string]string{"server": `POST /v1/` + "\uFFFD" + `\x0d\x0aHost: evil`, "client": `other m\x0d\x0a\x1b[31m` + "\uFFFD",
		"gen_ai.response.model":          strings.Repeat("模", 85), // 255 bytes: U+FFFD for the cut byte would not fit "gen_ai.response.id": `id\x00\u2028` + "\uFFFD",
		"gen_ai.response.finish_reasons": `stop\x85`} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if recv.exports.Load() == 0 || strings.Contains(buf.String(), "OpenTelemetry error") {
		t.Errorf("%d exports received; log:\n%s", recv.exports.Load(), buf.String())
	}
}

// OpenTelemetry's own errors (here: an export the OTLP exporter refuses,
// a span named with invalid UTF-8 outside the Tracer) reach the
// structured logger, and are counted.
func TestOTelErrorsToStructuredLog(t *testing.T) {
	recv := newReceiver(t)
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	o := setup(t, recv, &buf, reg)
	_, sp := o.Traces.Tracer("test").Start(context.Background(), "bad \xff name")
	sp.End()
	o.Shutdown(context.Background()) // the last batch is exported here; its error goes to the handler
	out := buf.String()
	if !strings.Contains(out, `"level":"ERROR","msg":"OpenTelemetry error"`) || !strings.Contains(out, "invalid UTF-8") {
		t.Fatalf("no structured OpenTelemetry error in the log:\n%s", out)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tokentap_otel_errors_total Errors OpenTelemetry's SDK reported (a failed export, a refused span), logged at most once per 30 s per kind.
# TYPE tokentap_otel_errors_total counter
tokentap_otel_errors_total 1
`), "tokentap_otel_errors_total"); err != nil {
		t.Fatal(err)
	}
	if recv.exports.Load() != 0 {
		t.Fatalf("the refused batch reached the receiver")
	}
}
