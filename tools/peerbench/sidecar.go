package main

import (
	"context"
	"errors"
	"flag"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/tokentap/tokentap/app"
	"github.com/tokentap/tokentap/internal/usage"
)

// sidecarCmd runs the sidecar exactly as cmd/sidecar does (app.Run with
// the flags after "--"), plus Go's profiling endpoints on -pprof, so
// that the run command can take CPU and allocation profiles of it under
// the peers' workload. The sidecar itself serves no profiling endpoint.
func sidecarCmd(args []string) error {
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	addr := fs.String("pprof", "", "address of /debug/pprof/ (empty: none)")
	rate := fs.Int("memprofilerate", runtime.MemProfileRate, "bytes allocated per heap profile sample (1: every allocation, for an exact breakdown of the memory per stream)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runtime.MemProfileRate = *rate
	if *addr == "" {
		return runSidecar(fs.Args())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.ListenAndServe()
	defer srv.Close()

	return runSidecar(fs.Args())
}

func runSidecar(args []string) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	err := app.Run(ctx, args, app.Env{Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
	if usage.ExitCode(err) == 2 {
		return errors.New("sidecar flags: " + err.Error())
	}
	return err
}
