package stream

import "bytes"

// ParseMessages reads one Anthropic Messages API payload into c: the data
// of one SSE event of POST /v1/messages with "stream":true, or a whole
// non-streaming message. It never allocates.
//
// Sources: Anthropic's Go SDK (anthropics/anthropic-sdk-go
// packages/ssestream/ssestream.go: the events message_start,
// content_block_start, content_block_delta, content_block_stop,
// message_delta, message_stop; "ping" is skipped; "error" ends the stream
// with an API error) and two servers of the API: Ollama v0.17.4
// (anthropic/anthropic.go, StreamConverter: message_start with
// usage.input_tokens, text_delta / thinking_delta / input_json_delta
// deltas, message_delta with stop_reason and usage, message_stop; errors
// {"type":"error","error":{"type":...,"message":...}}) and llama.cpp
// (tools/server/server-task.cpp, to_json_anthropic_stream: thinking,
// text and tool_use blocks, usage with cache_read_input_tokens). vLLM's
// translation ends an error with a non-Anthropic "data: [DONE]", read as
// the end marker.
//
// What counts:
//   - output: a content_block_delta whose delta is a text_delta with text
//     or an input_json_delta with partial_json (tool input);
//   - reasoning: a thinking_delta with thinking; signature and citation
//     deltas carry no tokens;
//   - usage: message_start's message.usage gives the input (input_tokens
//     plus the cache reads and writes Anthropic counts apart; the cache
//     reads are the cached tokens); its output_tokens is a placeholder and
//     is not read; message_delta's usage.output_tokens is the final,
//     cumulative output count, with the stop_reason as finish reason;
//   - the end: message_stop (Done);
//   - errors: the "error" event, error.type as its type (overloaded_error
//     and rate_limit_error mean a rejection).
//
// The message id (msg_...) and model come from message_start.
func ParseMessages(data []byte, c *Chunk) { parseMessages(data, c, nil) }

// parseMessages is ParseMessages, writing to t (when not nil) the answer
// text: the text of the text_delta deltas, or of a whole message's text
// blocks (not the thinking, nor the tool input); and the tool calls: a
// tool_use block, its input the input_json_delta deltas of its index
// (streamed) or its input object (whole). A server tool's block
// (server_tool_use, mcp_tool_use: Anthropic runs the tool, and streams
// its input as input_json_delta all the same) is no call of the
// client's, streamed or whole: its deltas began no call and are not
// read (vercel/ai packages/anthropic/src/__fixtures__/anthropic-web-search-tool.1.chunks.txt,
// a recorded web_search stream; read as a call, it had no name and
// failed unknown_tool).
func parseMessages(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	if bytes.Equal(d, doneMarker) {
		c.Done = true
		return
	}
	var typ, message, block, delta, usage, errv, id, model, stop, content, index []byte
	ok := eachMember(d, func(k, v []byte) bool {
		switch string(k) {
		case "index":
			index = v
		case "type":
			typ, _ = strVal(v)
		case "message":
			message = v
		case "content_block":
			block = v
		case "delta":
			delta = v
		case "usage":
			usage = v
		case "error":
			errv = v
		case "id":
			id = v
		case "model":
			model = v
		case "stop_reason":
			stop = v
		case "content":
			content = v
		}
		return true
	})
	if !ok {
		*c = Chunk{Malformed: true, Choices: -1}
		return
	}
	switch string(typ) {
	case "message_start":
		eachMember(message, func(k, v []byte) bool {
			switch string(k) {
			case "id":
				c.ID, _ = strVal(v)
			case "model":
				c.Model, _ = strVal(v)
			case "usage": // its output_tokens is a placeholder
				readUsage(&usageMessagesStart, v, c)
			}
			return true
		})
	case "content_block_start":
		var btyp, name []byte
		eachMember(block, func(k, v []byte) bool {
			switch string(k) {
			case "type":
				btyp = v
			case "name":
				name = v
			case "text":
				c.Output = c.Output || nonEmptyStr(v)
			case "thinking":
				c.Reasoning = c.Reasoning || nonEmptyStr(v)
			}
			return true
		})
		if t != nil && string(btyp) == `"tool_use"` {
			t.callName(callKey(index, 0), name) // its input is {}: the input_json_delta deltas follow
		}
	case "content_block_delta":
		var dtyp, text, partial []byte
		eachMember(delta, func(k, v []byte) bool {
			switch string(k) {
			case "text":
				c.Output = c.Output || nonEmptyStr(v)
				text = v
			case "partial_json":
				c.Output = c.Output || nonEmptyStr(v)
				partial = v
			case "thinking":
				c.Reasoning = c.Reasoning || nonEmptyStr(v)
			case "type":
				dtyp = v
			}
			return true
		})
		if t != nil && string(dtyp) == `"text_delta"` {
			t.add(text)
		}
		// Only a tool_use block's input is a call's arguments: a server
		// tool's block began no call (parseMessages).
		if t != nil && string(dtyp) == `"input_json_delta"` && t.began(callKey(index, 0)) {
			t.callArgs(callKey(index, 0), partial, true)
		}
	case "message_delta":
		eachMember(delta, func(k, v []byte) bool {
			if string(k) == "stop_reason" {
				c.FinishReason, _ = strVal(v)
			}
			return true
		})
		readUsage(&usageMessages, usage, c)
	case "message_stop":
		c.Done = true
	case "error":
		c.Error = true
		if isObject(errv) {
			parseError(errv, c)
		}
		if c.ErrorType == nil {
			c.ErrorType = []byte("error")
		}
	case "message": // a whole non-streaming message
		c.ID, _ = strVal(id)
		c.Model, _ = strVal(model)
		c.FinishReason, _ = strVal(stop)
		readUsage(&usageMessages, usage, c)
		c.Done = true
		if t != nil {
			eachElement(content, func(b []byte) bool {
				var btyp, text, name, input []byte
				eachMember(b, func(k, v []byte) bool {
					switch string(k) {
					case "type":
						btyp = v
					case "text":
						text = v
					case "name":
						name = v
					case "input":
						input = v
					}
					return true
				})
				switch string(btyp) {
				case `"text"`:
					t.add(text)
				case `"tool_use"`:
					t.callArgs(t.callName(newCall, name), input, false)
				}
				return true
			})
		}
	case "":
		if len(errv) > 0 && string(errv) != "null" {
			c.Error = true
			if isObject(errv) {
				parseError(errv, c)
			} else {
				c.ErrorType = []byte("error")
			}
		}
	}
}

// usageMessages: Anthropic's usage. The input count is input_tokens
// plus cache_read_input_tokens and cache_creation_input_tokens
// (Anthropic counts cached input apart from input_tokens), the cache
// reads being the cached tokens. usageMessagesStart is message_start's,
// whose output_tokens is a placeholder.
var (
	usageMessages = Usage{Input: []string{"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"},
		Cached: []string{"cache_read_input_tokens"}, Output: []string{"output_tokens"}}
	usageMessagesStart = Usage{Input: usageMessages.Input, Cached: usageMessages.Cached}
)
