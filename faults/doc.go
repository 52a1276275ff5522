// Package faults is the fault suite: it runs the real sidecar binary as a
// subprocess, in front of test upstreams that misbehave on purpose, and
// checks that the sidecar stays production-grade under each fault. It has
// no code of its own; everything is in its tests.
//
// TestMain builds ./cmd/sidecar once per test binary. Every test starts
// its own sidecar with --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0,
// reads the proxy and metrics URLs from the "tokentap is up" log line, and
// asserts, per fault, what a client and an operator see:
//
//   - the client's bytes (identical to the upstream's where they must be);
//   - the records file: the request's record present, every line whole
//     JSON, with the expected outcome and error_type;
//   - the relevant counters on the sidecar's own /metrics;
//   - where it matters, the sidecar's RSS (/proc/PID/status VmRSS), its
//     goroutines (go_goroutines on /metrics) and its descriptors
//     (/proc/PID/fd), during and after the load.
//
// The faults: a full disk under the records file (tmpfs, needs root: the
// test skips loudly outside CI and fails with CI=true), rotation with
// SIGHUP, idle and slow-body clients against a stream that flows past
// every timeout, --max-connections, an upstream that floods strip mode
// with field lines and no event end, shutdown with streams past the grace
// period (and a second signal), truncated streams, a password in the
// upstream URL, gzip upstreams, 1 MB model names, a burst of streams
// whose clients all leave mid-stream, a config file that is a FIFO,
// records to a FIFO with no reader or to a pipe (a FIFO, stdout) whose
// reader stopped reading, and an upstream that leads back to the
// sidecar (named at start, or through an alias: the Via header).
//
// Every load is bounded in count and time, and all traffic stays on
// 127.0.0.1. The suite is Linux-only (/proc, tmpfs). Run it alone:
//
//	go test -count=1 -race ./faults/
//
// scripts/soak.sh, with the load generator in tools/soak, is the long
// counterpart: hundreds of streams for minutes, with RSS, goroutines and
// descriptors printed at the start and at the end.
package faults
