package stream

// TopMembers walks the top-level members of the JSON object that starts
// b (white space before it allowed), in one pass, without allocating:
// for every member whose value is complete it calls fn with the raw key
// (without quotes, escapes kept) and the value's byte range
// b[start:end]. A value is complete when a byte follows it (the ',' or
// '}' after it), so that a number cut by the end of a truncated prefix
// ("max_tokens":1 of "max_tokens":128) is not taken for a whole one.
//
// It returns the index just after the object's closing '}', or -1 when b
// does not start with an object, the object is malformed, or b ends
// inside it; fn has then been called for every complete member before
// that point, so a prefix of a body, or a body with bytes after its
// object, can still be read. Structure is checked (brackets, strings,
// commas, colons), not the grammar of numbers and literals.
func TopMembers(b []byte, fn func(key []byte, start, end int)) int {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return -1
	}
	e := walkObject(b, i, func(k []byte, v int) int {
		ve := skipValue(b, v)
		if ve < 0 || skipWS(b, ve) >= len(b) {
			return -1
		}
		fn(k, v, ve)
		return ve
	})
	if e < 0 {
		return -1
	}
	return e
}
