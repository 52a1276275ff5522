package stream

// A small JSON scanner that never allocates. It walks object members and
// array elements of a document held in memory and hands out raw byte
// slices of values. It checks structure (brackets, strings, commas, colons)
// but not the grammar of numbers and literals; keys are compared as their
// raw bytes, without unescaping (the engine payloads we read never escape
// their keys). Design note: encoding/json allocates for every decoded
// string, and one decode per streamed token would break the zero-allocation
// rule of the hot path.

import "bytes"

const maxDepth = 4096

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// skipString returns the index after the closing quote of the string that
// starts at b[i] == '"', or -1. It jumps from quote to quote with
// bytes.IndexByte (vectorised): a quote closes the string unless an odd
// run of backslashes precedes it.
func skipString(b []byte, i int) int {
	for i++; i <= len(b); {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		q := i + j
		k := q
		for k > i && b[k-1] == '\\' { // b[i-1] is a quote: the run stops there
			k--
		}
		if (q-k)%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
	return -1
}

// skipValue returns the index just after the JSON value starting at or
// after b[i] (leading white space allowed; trailing white space is not
// part of the value), or -1 if it is malformed.
// Strings and literals, most of the values a payload holds, are skipped
// here; containers by skipContainer, whose nesting stack (512 bytes) is
// zeroed only when there is a container to skip.
func skipValue(b []byte, i int) int {
	i = skipWS(b, i)
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		return skipContainer(b, i)
	case '}', ']', ',', ':':
		return -1
	}
	start := i
	for i < len(b) && !isWS(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ':' {
		i++
	}
	if !literalOK(b[start:i]) {
		return -1
	}
	return i
}

// skipContainer returns the index just after the object or array that
// starts at b[i], or -1 if it is malformed.
func skipContainer(b []byte, i int) int {
	var stack [maxDepth / 64]uint64 // 1 bit per level: 1 = object
	depth := 0
	for {
		if i >= len(b) {
			return -1
		}
		// at the start of a value
		switch c := b[i]; c {
		case '"':
			if i = skipString(b, i); i < 0 {
				return -1
			}
		case '{', '[':
			if depth >= maxDepth {
				return -1
			}
			if c == '{' {
				stack[depth/64] |= 1 << (depth % 64)
			} else {
				stack[depth/64] &^= 1 << (depth % 64)
			}
			depth++
			i = skipWS(b, i+1)
			if i < len(b) && (b[i] == '}' || b[i] == ']') {
				break // empty container: closed below
			}
			if c == '{' {
				if i = objKey(b, i); i < 0 {
					return -1
				}
			}
			continue
		case '}', ']', ',', ':':
			return -1
		default:
			start := i
			for i < len(b) && !isWS(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ':' {
				i++
			}
			if i == start || !literalOK(b[start:i]) {
				return -1
			}
		}
		// after a value: close containers or move to the next member
		for {
			if depth == 0 {
				return i
			}
			if i = skipWS(b, i); i >= len(b) {
				return -1
			}
			isObj := stack[(depth-1)/64]&(1<<((depth-1)%64)) != 0
			switch b[i] {
			case ',':
				i = skipWS(b, i+1)
				if isObj {
					if i = objKey(b, i); i < 0 {
						return -1
					}
				}
			case '}':
				if !isObj {
					return -1
				}
				depth--
				i++
				continue
			case ']':
				if isObj {
					return -1
				}
				depth--
				i++
				continue
			default:
				return -1
			}
			break
		}
	}
}

// objKey expects `"key" :` at b[i] and returns the index of the value.
func objKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = skipString(b, i); i < 0 {
		return -1
	}
	return afterKey(b, i)
}

// afterKey expects ` :` after a key that ends before b[i] and returns the
// index of the value.
func afterKey(b []byte, i int) int {
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipWS(b, i+1)
}

func literalOK(l []byte) bool {
	switch string(l) {
	case "true", "false", "null":
		return true
	}
	c := l[0]
	return c == '-' || (c >= '0' && c <= '9')
}

// stopWalk, returned by a walkObject or walkArray callback, stops the walk
// early; the walk then returns it too.
const stopWalk = -2

// walkObject walks the object whose '{' is at b[i], in one pass: for each
// member it calls fn with the raw key (without quotes) and the index of
// the value's first byte, and fn returns the index just after the value
// (skipValue(b, v) for a value it does not read; a nested walk for one it
// does, so that nothing is scanned twice), -1 when the value is
// malformed, or stopWalk. walkObject returns the index just after the
// closing '}', -1 if the object is malformed, or stopWalk.
func walkObject(b []byte, i int, fn func(key []byte, v int) int) int {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		ke := skipString(b, i)
		if ke < 0 {
			return -1
		}
		v := afterKey(b, ke)
		if v < 0 || v >= len(b) {
			return -1
		}
		e := fn(b[i+1:ke-1], v)
		if e < 0 {
			return e
		}
		if i = skipWS(b, e); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return i + 1
		default:
			return -1
		}
	}
}

// walkArray is walkObject for the array whose '[' is at b[i]: fn gets the
// index of each element's first byte.
func walkArray(b []byte, i int, fn func(v int) int) int {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		if i >= len(b) {
			return -1
		}
		e := fn(i)
		if e < 0 {
			return e
		}
		if i = skipWS(b, e); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return i + 1
		default:
			return -1
		}
	}
}

// eachMember calls fn for every member of the object in b (white space
// around it allowed) with the raw key (without quotes) and the raw value.
// fn returns false to stop. It returns false if b is not a well-formed
// object.
func eachMember(b []byte, fn func(key, val []byte) bool) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	e := walkObject(b, i, func(k []byte, v int) int {
		ve := skipValue(b, v)
		if ve >= 0 && !fn(k, b[v:ve]) {
			return stopWalk
		}
		return ve
	})
	return e == stopWalk || (e >= 0 && skipWS(b, e) == len(b))
}

// eachElement calls fn for every element of the array in b. It returns
// false if b is not a well-formed array.
func eachElement(b []byte, fn func(val []byte) bool) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	e := walkArray(b, i, func(v int) int {
		ve := skipValue(b, v)
		if ve >= 0 && !fn(b[v:ve]) {
			return stopWalk
		}
		return ve
	})
	return e == stopWalk || (e >= 0 && skipWS(b, e) == len(b))
}

// countAt counts the elements of the array value at b[v] and returns the
// index just after it (n is -1 and the value skipped when it is not an
// array).
func countAt(b []byte, v int) (n, end int) {
	if b[v] != '[' {
		return -1, skipValue(b, v)
	}
	n = 0
	end = walkArray(b, v, func(e int) int { n++; return skipValue(b, e) })
	return n, end
}

func trimWS(b []byte) []byte {
	for len(b) > 0 && isWS(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	for len(b) > 0 && isWS(b[0]) {
		b = b[1:]
	}
	return b
}

// strVal returns the raw contents of a JSON string value (escapes kept)
// and whether v is a string.
func strVal(v []byte) ([]byte, bool) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1], true
	}
	return nil, false
}

// intVal parses a JSON integer value (a number with no fraction or
// exponent); ok is false otherwise or on overflow.
func intVal(v []byte) (n int64, ok bool) {
	if len(v) == 0 {
		return 0, false
	}
	neg := v[0] == '-'
	if neg {
		v = v[1:]
	}
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// countElements returns the number of elements of a JSON array value, or
// -1 if v is not an array.
func countElements(v []byte) int {
	v = trimWS(v)
	if len(v) == 0 {
		return -1
	}
	n, end := countAt(v, 0)
	if end != len(v) {
		return -1
	}
	return n
}

// MemberSpan returns the byte range [start, end) of the JSON object obj
// to delete so that its member key is gone and the rest is unchanged
// valid JSON: the member and the comma that joined it to the member
// before it (or, for the first member, to the one after it). ok is false
// when obj is not a well-formed object or has no such member. It never
// allocates.
func MemberSpan(obj []byte, key string) (start, end int, ok bool) {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return 0, 0, false
	}
	i = skipWS(obj, i+1)
	prevEnd := -1 // where the previous member's value ends
	for i < len(obj) && obj[i] == '"' {
		ke := skipString(obj, i)
		v := objKey(obj, i)
		if ke < 0 || v < 0 {
			return 0, 0, false
		}
		ve := skipValue(obj, v)
		if ve < 0 {
			return 0, 0, false
		}
		vend := ve
		for vend > v && isWS(obj[vend-1]) {
			vend--
		}
		next := skipWS(obj, ve)
		if next >= len(obj) || (obj[next] != ',' && obj[next] != '}') {
			return 0, 0, false
		}
		if string(obj[i+1:ke-1]) == key {
			switch {
			case prevEnd >= 0:
				return prevEnd, vend, true
			case obj[next] == ',':
				return i, skipWS(obj, next+1), true
			default:
				return i, vend, true
			}
		}
		if obj[next] == '}' {
			return 0, 0, false
		}
		prevEnd = vend
		i = skipWS(obj, next+1)
	}
	return 0, 0, false
}

// isNumber reports whether v (a whole JSON value, skipValue's span) is a
// number: it starts with '-' or a digit.
func isNumber(v []byte) bool {
	return len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9')
}
