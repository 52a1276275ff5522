package exporter

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tokentap/tokentap/record"
)

// OTLP is the OTLP backend of the one mapping: the same instruments as
// /metrics on an OTel meter, under the GenAI semantic-convention names
// and units with the same explicit bucket boundaries, and the same
// bounded label values (empty ones are left out, as the conventions
// prefer). It observes at the end of each request (gaps included), so
// the hot path is untouched.
type OTLP struct {
	hist     [numInstruments]metric.Float64Histogram
	ctr      [numInstruments]metric.Int64Counter
	provider string // gen_ai.provider.name
}

// NewOTLP creates the instruments on mp. Of cfg it reads ProviderName
// only: the model label comes bounded in the labels Publish is given.
func NewOTLP(mp metric.MeterProvider, cfg Config) (*OTLP, error) {
	m := mp.Meter("github.com/tokentap/tokentap/exporter")
	o := &OTLP{provider: providerName(cfg.ProviderName)}
	var errs []error
	for i, s := range specs {
		var err error
		if s.Counter {
			o.ctr[i], err = m.Int64Counter(s.OTel, metric.WithUnit(s.Unit), metric.WithDescription(s.Help))
		} else {
			o.hist[i], err = m.Float64Histogram(s.OTel, metric.WithUnit(s.Unit), metric.WithDescription(s.Help),
				metric.WithExplicitBucketBoundaries(s.Buckets...))
		}
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

// Publish records a finished record's observations under its key k
// (k.Model: the model label, bounded as for Prometheus).
//
// Design note: the attribute set of an instrument is built once per
// Publish and reused while its label values stay the same. Map emits
// every ITL gap of the request (a few hundred on a long answer) under
// the same labels, and building a set per gap (a slice, a sorted copy
// and an interface value) was the sidecar's largest allocation; now a
// gap allocates nothing (TestOTLPPublishAllocsPerTokenZero).
func (o *OTLP) Publish(r *record.Record, k record.Key) {
	ctx := context.Background()
	var (
		lastInst = numInstruments // none yet
		lastVals Labels           // the labels the options were built from
		// The options as the slices the variadic calls take: passing a
		// slice with ... allocates nothing per call.
		lastRec []metric.RecordOption
		lastAdd []metric.AddOption
	)
	l := BaseLabels(k)
	l[LProvider] = o.provider
	Map(r, l, true, func(i Instrument, v float64, l *Labels) {
		s := &specs[i]
		same := i == lastInst
		for _, lab := range s.Labels {
			if !same {
				break
			}
			same = l[lab] == lastVals[lab]
		}
		if !same {
			attrs := make([]attribute.KeyValue, 0, len(s.Labels))
			for _, lab := range s.Labels {
				lastVals[lab] = l[lab]
				if l[lab] != "" {
					attrs = append(attrs, attribute.String(otelAttr[lab], l[lab]))
				}
			}
			set := metric.WithAttributeSet(attribute.NewSet(attrs...))
			lastInst, lastRec, lastAdd = i, []metric.RecordOption{set}, []metric.AddOption{set}
		}
		if s.Counter {
			o.ctr[i].Add(ctx, int64(v), lastAdd...)
		} else {
			o.hist[i].Record(ctx, v, lastRec...)
		}
	})
}
