// Command peerbench measures what a proxy adds to a token stream, and what
// it costs, against its peers, in one run on one machine: the client
// directly against an SSE engine stand-in, then through a bare Go
// httputil.ReverseProxy, an epoll event-loop relay (loop.go), the sidecar (tokentap, every instrument on; and
// again with OTLP off, to state what OTLP adds), and nginx, haproxy and
// caddy when they are installed. scripts/peers.sh builds it and runs it.
//
//	peerbench run -sidecar BIN [-streams 50,200] [-duration 10s] [-runs 3] [-memory 1000]
//	peerbench capacity -sidecar BIN [-steps 100,200,...] [-duration 6s] [-limit 5ms]
//	peerbench upstream -listen ADDR [-events 200] [-interval 20ms]
//	peerbench bare -listen ADDR -to URL
//	peerbench loop -listen ADDR -to HOST:PORT
//	peerbench client -url URL [-streams 50] [-duration 10s]
//	peerbench sidecar -pprof ADDR -- SIDECAR-FLAGS...
//	peerbench split [-hz 1999] NAME=PERF-SCRIPT-FILE:EVENTS...
//
// The upstream stamps every SSE event with its wall-clock send time; the
// client, on the same machine, subtracts it from the arrival time. The
// delay through a proxy minus the delay direct is what the proxy adds per
// event. A proxy's CPU is read from /proc (its process and children:
// nginx's workers) over the client's measuring window, and divided by the
// events the client received in that window. The capacity mode raises
// the streams step by step through direct, bare Go, the sidecar and
// nginx, and finds each path's event rate at which its added p99 delay
// first exceeds 5 ms (capacity.go). docs/performance.md says how to
// read the tables. Everything listens on 127.0.0.1, and every load
// is bounded in streams and time.
//
// Adapted from the project's peers harness (shared/bench, streambench);
// this copy needs nothing outside the repository at run time.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peerbench run|capacity|upstream|bare|loop|client|otlp|sidecar|split [flags]")
		os.Exit(2)
	}
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "run":
		err = runCmd(args)
	case "capacity":
		err = capacityCmd(args)
	case "upstream":
		err = upstreamCmd(args)
	case "bare":
		err = bareCmd(args)
	case "loop":
		err = loopCmd(args)
	case "client":
		err = clientCmd(args)
	case "otlp":
		err = otlpCmd(args)
	case "sidecar":
		err = sidecarCmd(args)
	case "split":
		err = splitCmd(args)
	default:
		err = fmt.Errorf("unknown mode %q (run, capacity, upstream, bare, loop, client, otlp, sidecar, split)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}
