package app

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokentap/tokentap/record"
)

type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// Records that cannot be written to stdout are counted on /metrics.
func TestStdoutRecordsDroppedAreExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	j := record.NewJSONL(brokenPipe{})
	exportStdoutStats(reg, j)
	for range 3 {
		j.Write(record.New(0))
	}
	if n, err := testutil.GatherAndCount(reg, "tokentap_records_dropped_total"); err != nil || n != 1 {
		t.Fatalf("%d series (%v)", n, err)
	}
	fams, _ := reg.Gather()
	if v := fams[0].GetMetric()[0].GetCounter().GetValue(); v != 3 {
		t.Fatalf("tokentap_records_dropped_total %v, want 3", v)
	}
}
