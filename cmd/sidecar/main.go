// Command sidecar is tokentap: a reverse proxy in front of an
// OpenAI-compatible inference engine that times every streamed token and
// exports what users experience. Run it with no flags to see it work in
// front of its built-in simulated engine; see README.md. "sidecar replay"
// replays a workload trace against an engine, "sidecar capture merge" and
// "sidecar capture stats" read captures (docs/capture.md).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokentap/tokentap/app"
	"github.com/tokentap/tokentap/capture/cli"
	"github.com/tokentap/tokentap/internal/usage"
	"github.com/tokentap/tokentap/replay"
)

func main() {
	// The first SIGTERM or SIGINT starts a graceful shutdown; a second one
	// cuts the remaining streams at once (they are still recorded).
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	force := make(chan struct{})
	go func() {
		<-stop
		cancel()
		<-stop
		close(force)
	}()
	if len(os.Args) > 1 && os.Args[1] == "replay" {
		err := replay.Main(ctx, os.Args[2:], replay.Env{Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
		cancel()
		if err != nil && usage.ExitCode(err) != 2 {
			os.Stderr.WriteString("tokentap replay: " + err.Error() + "\n")
		}
		os.Exit(usage.ExitCode(err))
	}
	if len(os.Args) > 1 && os.Args[1] == "capture" {
		err := cli.Main(ctx, os.Args[2:], cli.Env{Stdout: os.Stdout, Stderr: os.Stderr})
		cancel()
		if err != nil && usage.ExitCode(err) != 2 {
			os.Stderr.WriteString("sidecar capture: " + err.Error() + "\n")
		}
		os.Exit(usage.ExitCode(err))
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // reopen the records file; never exit
	// A closed stdout or stderr (records: -, a log pipe whose reader
	// left) fails its writes with EPIPE, counted, rather than killing
	// the sidecar and the traffic through it (docs/records-file.md).
	signal.Ignore(syscall.SIGPIPE)
	err := app.Run(ctx, os.Args[1:], app.Env{Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr, Hangup: hup, Force: force})
	cancel()
	if err != nil && usage.ExitCode(err) != 2 {
		os.Stderr.WriteString("sidecar: " + err.Error() + "\n")
	}
	os.Exit(usage.ExitCode(err))
}
