// Command sidecar is tokentap: a reverse proxy in front of an
// OpenAI-compatible inference engine that times every streamed token and
// exports what users experience. Run it with no flags to see it work in
// front of its built-in simulated engine; see README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tokentap/tokentap/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // reopen the records file; never exit
	err := app.Run(ctx, os.Args[1:], app.Env{Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr, Hangup: hup})
	stop()
	if err != nil && app.ExitCode(err) != 2 {
		os.Stderr.WriteString("sidecar: " + err.Error() + "\n")
	}
	os.Exit(app.ExitCode(err))
}
