package app

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokentap/tokentap/record"
)

type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// Records that cannot be written to stdout are counted on /metrics, as
// a records file's are.
func TestStdoutRecordsDroppedAreExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	j := record.NewStream(brokenPipe{}, record.FileOptions{})
	exportFileStats(reg, j)
	for range 3 {
		j.Write(record.New(0))
	}
	if err := j.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := counterValue(t, reg, "tokentap_records_dropped_total"); v != 3 {
		t.Fatalf("tokentap_records_dropped_total %v, want 3", v)
	}
	if v := counterValue(t, reg, "tokentap_records_written_total"); v != 0 {
		t.Fatalf("tokentap_records_written_total %v, want 0", v)
	}
}

// counterValue gathers the one sample of counter name.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}
