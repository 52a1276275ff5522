package record

// Sink receives finished records. Implementations must be safe for
// concurrent use; Write is called once per request, never per token.
// File (OpenFile, NewStream) is the records file's, and stdout's.
type Sink interface {
	Write(r *Record)
}
