package app

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/tokentap/tokentap/egress"
	"github.com/tokentap/tokentap/pipeline"
)

// newEgress builds the egress forward proxy (docs/egress.md) beside the
// reverse proxy when egress.listen is set: the same pipeline, the same
// limits and timeouts (peek bytes and budget, request timeout, idle and slow body, header
// and keep-alive timeouts), its own listener under the reverse proxy's
// connection limit (one descriptor budget for both).
func (s *Sidecar) newEgress(pipe *pipeline.Pipeline, probeSecret string, limit *connLimit) error {
	cfg := s.cfg
	if cfg.Egress.Listen == "" {
		return nil
	}
	px, err := egress.New(egress.Options{
		Config:            cfg.Egress,
		Pipeline:          pipe,
		Logger:            s.log,
		Registry:          s.metrics.Registry,
		PeekBytes:         cfg.PeekBytes,
		PeekBudget:        s.peeks,
		Timeout:           cfg.Timeout,
		BodyReadTimeout:   cfg.BodyReadTimeout,
		BodyMinRate:       cfg.BodyMinRate,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		ProbeHeader:       probeSecret,
		Structure:         s.stages.ProxyStructure(),
		Tenants:           s.stages.ProxyTenants(),
		Via:               s.via,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Egress.Listen)
	if err != nil {
		return fmt.Errorf("egress listen: %w", err)
	}
	s.defer_(func() { ln.Close(); px.Close() })
	s.eln = limit.listener(ln)
	s.egress = px
	s.addrs.Egress = s.eln.Addr().String()
	return nil
}

// serveEgress serves the egress proxy, if there is one. The sidecar's
// other listeners (the reverse proxy's, the admin port's) are refused as
// its destinations, as its own address is.
func (s *Sidecar) serveEgress(errc chan<- error) {
	if s.egress != nil {
		go func() { errc <- s.egress.Serve(s.eln, s.pln.Addr(), s.aln.Addr()) }()
	}
}

// shutdownEgress shuts the egress proxy down as the reverse proxy is:
// in-flight requests get the grace period (sctx), then are cut and
// recorded as error/shutdown. The channel yields how many were cut.
func (s *Sidecar) shutdownEgress(sctx context.Context) <-chan int {
	done := make(chan int, 1)
	if s.egress == nil {
		done <- 0
		return done
	}
	go func() {
		cut := 0
		if err := s.egress.Shutdown(sctx); err != nil {
			cut = s.egress.Cut()
			dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.egress.Shutdown(dctx); err != nil {
				s.egress.Close()
			}
			dcancel()
		}
		done <- cut
	}()
	return done
}
