package proxy

import (
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// Structure checks the structure of the answers to requests that declare
// tools or a JSON output (structure.Checker; docs/slo.md, "Structure").
// The proxy asks it for a Collector when a response begins and, once the
// response is over and the client has it, for the check: the schema
// library stays outside the data path (docs/design.md, "Packages and
// their direction").
type Structure interface {
	// Collector returns a Collector for a response to a request that
	// declared d; nil when no check applies.
	Collector(d *stream.Declared) *stream.Collector
	// Record checks what col collected against d and writes the
	// result's names into rec (record.Record.Structure,
	// StructureFailed, StructureUnchecked). partial: the request body
	// was not read whole; truncated: the answer was cut at its token
	// limit; lost: the tap lost some of the response. col may be nil;
	// Record does not keep it.
	Record(rec *record.Record, d *stream.Declared, col *stream.Collector, partial, truncated, lost bool)
}

// structureCheck prepares the structure check (Options.Structure) of a
// finished request: a successful answer to a request that declared tools
// or a JSON output, or whose body was not read whole (then it says
// unchecked: its declarations are unknown). It takes the collected
// content from the tap at once, and returns the check to run, nil when
// none applies. The check runs with the end stages (endStages), after
// the client's response is complete: a schema's cost never holds the
// client's bytes. It writes only the result's names into the record and
// returns the collected content to its pool.
func (p *Proxy) structureCheck(st *reqState) func() {
	k, t, rec := p.opts.Structure, st.tap, st.rec
	if k == nil {
		return nil
	}
	var col *stream.Collector
	lost := false
	if t != nil {
		col, t.col = t.col, nil
		lost = t.wholeOver || t.oversized > 0 || t.failed
	}
	a := rec.API.API()
	partial := st.info.Read != ""
	if a == nil || a.Request.Declares == nil || rec.Outcome != record.Success || (!partial && col == nil) {
		if col != nil {
			col.Release()
		}
		return nil
	}
	d, cut := &st.info.Declared, a.CutBy(rec.FinishReason)
	return func() {
		k.Record(rec, d, col, partial, cut, lost)
		if col != nil {
			col.Release()
		}
	}
}
