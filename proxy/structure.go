package proxy

import (
	"github.com/tokentap/tokentap/record"
	"github.com/tokentap/tokentap/stream"
)

// truncatedReasons are the finish reasons that say an answer was cut at
// its token limit: OpenAI's and Ollama's length, Anthropic's max_tokens,
// Gemini's MAX_TOKENS, the Responses API's max_output_tokens.
var truncatedReasons = []string{"length", "max_tokens", "MAX_TOKENS", "max_output_tokens"}

func truncated(reason string) bool {
	for _, r := range truncatedReasons {
		if reason == r {
			return true
		}
	}
	return false
}

// checkStructure runs the structure checks (Options.Structure) on a
// finished request, once: a successful answer to a request that declared
// tools or a JSON output, or whose body was not read whole (then it says
// unchecked: its declarations are unknown). It writes only the result's
// names into the record and returns the collected content to its pool.
func (p *Proxy) checkStructure(st *reqState) {
	k, t, rec := p.opts.Structure, st.tap, st.rec
	if k == nil {
		return
	}
	var col *stream.Collector
	lost := false
	if t != nil {
		col, t.col = t.col, nil
		lost = t.wholeOver || t.oversized > 0 || t.failed
	}
	if col != nil {
		defer col.Release()
	}
	a := stream.LookupAPI(string(rec.API))
	if a == nil || a.Request.Declares == nil || rec.Outcome != record.Success {
		return
	}
	partial := st.info.Read != ""
	if !partial && col == nil {
		return
	}
	res := k.Check(&st.info.Declared, col, partial, truncated(rec.FinishReason), lost)
	rec.Structure, rec.StructureFailed, rec.StructureUnchecked = res.Status, res.Failed, res.Why
}
