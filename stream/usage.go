package stream

// Usage names the members of an API's usage object (OpenAI's usage,
// Gemini's usageMetadata, TGI's details, or a native payload's top level)
// that give its token counts: one reader (readUsage, usageCounts) serves
// every adapter. A name "a.b" is member b of the object member a. Each
// count is the sum of its members that are integers, and is set only when
// one of them is; a count with no member named is never set.
type Usage struct {
	// Input: the input (prompt) tokens, the cached ones included
	// (Chunk.PromptTokens, HasPrompt).
	Input []string
	// Cached: the input tokens served from the engine's cache
	// (Chunk.CachedTokens).
	Cached []string
	// Output: the output tokens (Chunk.CompletionTokens, Usage).
	Output []string
	// Reasoning: reasoning tokens the API counts apart from Output
	// (Gemini's thoughtsTokenCount), added to the output count; empty
	// where Output includes them (OpenAI's reasoning_tokens).
	Reasoning []string
}

// usageCounts sums the members of one usage object; the zero value has
// seen none.
type usageCounts struct {
	in, cached, out          int64
	hasIn, hasCached, hasOut bool
}

// readUsage reads the usage object v as described by u into c.
func readUsage(u *Usage, v []byte, c *Chunk) {
	var s usageCounts
	eachMember(v, func(k, v []byte) bool {
		s.member(u, k, v)
		return true
	})
	s.set(c)
}

// member counts the member k of value v when u names it (or names a
// member of it, "k.name").
func (s *usageCounts) member(u *Usage, k, v []byte) {
	for i, names := range [...][]string{u.Input, u.Cached, u.Output, u.Reasoning} {
		for _, name := range names {
			if name == string(k) {
				s.add(i, v)
			} else if len(name) > len(k) && name[len(k)] == '.' && name[:len(k)] == string(k) {
				rest := name[len(k)+1:]
				eachMember(v, func(k, v []byte) bool {
					if rest == string(k) {
						s.add(i, v)
					}
					return true
				})
			}
		}
	}
}

// add adds the integer v to the count i (the order of Usage's fields).
func (s *usageCounts) add(i int, v []byte) {
	n, ok := intVal(v)
	if !ok {
		return
	}
	switch i {
	case 0:
		s.in, s.hasIn = s.in+n, true
	case 1:
		s.cached, s.hasCached = s.cached+n, true
	default:
		s.out, s.hasOut = s.out+n, true
	}
}

// set writes the counts seen into c, keeping c's others.
func (s *usageCounts) set(c *Chunk) {
	if s.hasIn {
		c.PromptTokens, c.HasPrompt = s.in, true
	}
	if s.hasCached {
		c.CachedTokens = s.cached
	}
	if s.hasOut {
		c.CompletionTokens, c.Usage = s.out, true
	}
}
