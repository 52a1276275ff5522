package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

// otlpSummary is what the OTLP sink writes when it stops.
type otlpSummary struct {
	Traces      int64 `json:"traces"`       // POSTs to /v1/traces
	Metrics     int64 `json:"metrics"`      // POSTs to /v1/metrics
	TraceBytes  int64 `json:"trace_bytes"`  // their bodies' bytes, as sent (maybe compressed)
	MetricBytes int64 `json:"metric_bytes"` // idem
	Other       int64 `json:"other"`        // anything else: answered 404
}

// otlpSink counts the exports it is sent.
type otlpSink struct {
	traces, metrics, traceBytes, metricBytes, other atomic.Int64
}

// ServeHTTP reads and discards each export and answers 200 with an
// empty body, a valid (empty) OTLP/HTTP protobuf response: it stands in
// for a collector, keeping the run on loopback and self-contained.
func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var n, b *atomic.Int64
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/traces":
		n, b = &s.traces, &s.traceBytes
	case r.Method == http.MethodPost && r.URL.Path == "/v1/metrics":
		n, b = &s.metrics, &s.metricBytes
	default:
		s.other.Add(1)
		http.NotFound(w, r)
		return
	}
	got, err := io.Copy(io.Discard, r.Body)
	b.Add(got)
	if err != nil {
		http.Error(w, "read: "+err.Error(), http.StatusBadRequest)
		return
	}
	n.Add(1)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func (s *otlpSink) summary() otlpSummary {
	return otlpSummary{Traces: s.traces.Load(), Metrics: s.metrics.Load(),
		TraceBytes: s.traceBytes.Load(), MetricBytes: s.metricBytes.Load(), Other: s.other.Load()}
}

// otlpCmd runs the sink until SIGTERM or SIGINT, then writes its counts.
func otlpCmd(args []string) error {
	fs := flag.NewFlagSet("otlp", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "listen address (loopback)")
	addrFile := fs.String("addr-file", "", "write the bound address (host:port) to this file once listening")
	out := fs.String("out", "", "write the counts as JSON to this file when stopped")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			ln.Close()
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sink := &otlpSink{}
	srv := &http.Server{Handler: sink, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if *out != "" {
		return writeJSON(*out, sink.summary())
	}
	return nil
}
