package main

import (
	"bytes"
	"flag"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// upstreamCmd is the engine stand-in: every POST to a path ending in
// "completions" gets an OpenAI chat.completion.chunk stream of -events
// events (or max_tokens, when the request sets fewer), -interval apart,
// each stamped with its wall-clock send time ("ts", Unix nanoseconds),
// then a finish reason, the usage chunk when the request asked for it
// (stream_options.include_usage, as the sidecar does) and [DONE]. A
// request that declares tools ("tools": in its body) gets one tool call
// instead of text, its arguments streamed across the events
// (appendToolEvent), fitting the schema the client declares.
// /health answers 200; anything else 404, so that the sidecar's
// readiness and engine probes find no engine metrics.
func upstreamCmd(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:18000", "listen address")
	events := fs.Int("events", 200, "events per stream")
	interval := fs.Duration("interval", 20*time.Millisecond, "gap between events")
	first := fs.Duration("first", 50*time.Millisecond, "delay before the first event")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srv := &http.Server{Addr: *listen, Handler: &upstream{events: *events, interval: *interval, first: *first},
		ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

type upstream struct {
	events          int
	interval, first time.Duration
}

var (
	includeUsage = []byte(`"include_usage":true`)
	maxTokensKey = []byte(`"max_tokens":`)
	toolsKey     = []byte(`"tools":`)
)

// appendToolEvent appends event i of n of a tool-call stream, up to the
// choice's finish reason (the caller closes it and adds the stamp): one
// call of get_weather whose arguments, {"city":"xx…","days":3}, arrive
// across the n events, eight bytes of the city's name per event
// between the first and the last, and fit toolSchema; finish reason
// tool_calls.
func appendToolEvent(buf []byte, i, n int) []byte {
	buf = append(buf, `data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{`...)
	if i == 0 {
		buf = append(buf, `"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"`...)
	} else {
		buf = append(buf, `"tool_calls":[{"index":0,"function":{"arguments":"`...)
	}
	if i > 0 || n == 1 {
		buf = append(buf, `xxxxxxxx`...)
	}
	if i == n-1 {
		buf = append(buf, `\",\"days\":3}"}}]},"finish_reason":"tool_calls"`...)
	} else {
		buf = append(buf, `"}}]},"finish_reason":null`...)
	}
	return buf
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "completions") {
		if r.URL.Path == "/health" {
			io.WriteString(w, "ok\n")
			return
		}
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	n := u.events
	if i := bytes.Index(body, maxTokensKey); i >= 0 {
		j := i + len(maxTokensKey)
		k := j
		for k < len(body) && body[k] >= '0' && body[k] <= '9' {
			k++
		}
		if m, err := strconv.Atoi(string(body[j:k])); err == nil && m > 0 && m < n {
			n = m
		}
	}
	usage := bytes.Contains(body, includeUsage)
	tool := bytes.Contains(body, toolsKey)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	buf := make([]byte, 0, 512)
	t := time.NewTimer(u.first)
	defer t.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
		if tool {
			buf = appendToolEvent(buf[:0], i, n)
		} else {
			buf = append(buf[:0], `data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"xxxxxxxx"},"finish_reason":`...)
			if i == n-1 {
				buf = append(buf, `"length"`...)
			} else {
				buf = append(buf, `null`...)
			}
		}
		buf = append(buf, `}],"ts":`...)
		buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
		buf = append(buf, "}\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return
		}
		fl.Flush()
		t.Reset(u.interval)
	}
	if usage {
		buf = append(buf[:0], `data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":`...)
		buf = strconv.AppendInt(buf, int64(n), 10)
		buf = append(buf, `,"total_tokens":`...)
		buf = strconv.AppendInt(buf, int64(n+5), 10)
		buf = append(buf, "}}\n\n"...)
		w.Write(buf)
	}
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}

// bareCmd is the baseline: a bare httputil.ReverseProxy with a transport
// sized like the sidecar's, flushing after every write.
func bareCmd(args []string) error {
	fs := flag.NewFlagSet("bare", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:18001", "listen address")
	to := fs.String("to", "http://127.0.0.1:18000", "upstream URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*to)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, FlushInterval: -1,
		Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, DisableCompression: true}}
	srv := &http.Server{Addr: *listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

// otlpCmd is an OTLP/HTTP sink: it reads and discards every export and
// answers 200 with an empty (valid) protobuf response. It stands in for
// a collector's metrics pipeline (Jaeger takes traces only) and for
// Jaeger itself when it is not installed.
func otlpCmd(args []string) error {
	fs := flag.NewFlagSet("otlp", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:14318", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}
