package stream

import "strings"

// Google's Gemini API: POST {version}/models/{model}:generateContent (one
// JSON body) and :streamGenerateContent (with ?alt=sse an SSE stream of
// the same objects, one per data: event, and no end marker; without it a
// JSON array of them).
//
// Source: the API reference, https://ai.google.dev/api/generate-content
// (GenerateContentResponse: candidates, promptFeedback, usageMetadata,
// modelVersion, responseId; Candidate: content, finishReason, index;
// Content: parts, role; Part: text, thought, functionCall;
// UsageMetadata: promptTokenCount, cachedContentTokenCount,
// candidatesTokenCount, thoughtsTokenCount, totalTokenCount), and
// https://ai.google.dev/api#generatecontentrequest for the request
// (contents, generationConfig: maxOutputTokens, temperature, topP, seed).
// Errors are Google's error object, https://ai.google.dev/gemini-api/docs/troubleshooting:
// {"error":{"code":429,"message":"...","status":"RESOURCE_EXHAUSTED"}}.

// NameGemini is the Gemini API's name.
const NameGemini = "gemini"

// FormatGemini: Gemini's GenerateContentResponse (ParseGemini).
var FormatGemini = &WireFormat{name: NameGemini, parse: parseGemini}

// APIGemini describes the Gemini API.
var APIGemini = &API{Name: NameGemini, Format: FormatGemini, Operation: OpChat,
	Routes: []Route{{Path: ":streamGenerateContent"}, {Path: ":generateContent"}},
	Request: Request{StreamRoute: ":streamGenerateContent", MaxTokens: []string{"generationConfig.maxOutputTokens"},
		Sampling: "generationConfig", SamplingKeys: [3]string{"temperature", "topP", "seed"}, ModelFromPath: geminiModel,
		Declares: declaresGemini, DeclareKeys: []string{"tools", "generationConfig"},
		Prompt: []string{"tools", "systemInstruction", "system_instruction", "contents"},
		Text:   Text{Messages: "contents", Parts: true, System: []string{"systemInstruction", "system_instruction"}}},
	Response: Response{Cut: []string{"MAX_TOKENS"}}, // finishReason
	Probe: func(p ProbeParams) (string, map[string]any) {
		path := "/v1beta/models/" + strings.TrimPrefix(p.Model, "models/") + ":generateContent"
		if p.Stream {
			path = "/v1beta/models/" + strings.TrimPrefix(p.Model, "models/") + ":streamGenerateContent?alt=sse"
		}
		return path, map[string]any{"contents": []map[string]any{{"role": "user", "parts": []map[string]string{{"text": p.Prompt}}}},
			"generationConfig": map[string]any{"maxOutputTokens": p.MaxTokens, "temperature": p.Temperature, "seed": p.Seed}}
	},
	Hosts:      []string{"generativelanguage.googleapis.com"},
	KeyHeaders: []string{"x-goog-api-key", "Authorization"}, KeyQuery: "key", SendKey: KeyHeader{Name: "x-goog-api-key"}}

// geminiModel is the model a Gemini path names: the last segment before
// the ":method" (models/{model}:generateContent, tunedModels/{model}:...).
func geminiModel(path string) string {
	seg := path[strings.LastIndexByte(path, '/')+1:]
	m, _, _ := strings.Cut(seg, ":")
	return m
}

// ParseGemini reads one Gemini payload into c: the data of one SSE event
// of :streamGenerateContent?alt=sse, a whole :generateContent body, or the
// JSON array :streamGenerateContent sends without alt=sse (its elements
// pooled). It never allocates.
//
// What counts: a part with non-empty text is output, or reasoning when
// it has "thought":true; a functionCall part is output. A candidate's
// finishReason (STOP, MAX_TOKENS, SAFETY...) is the finish reason, or
// promptFeedback.blockReason when the prompt was blocked; there is no end
// marker. usageMetadata gives the input (promptTokenCount, with
// cachedContentTokenCount of it cached) and the output: candidatesTokenCount
// plus thoughtsTokenCount (the reasoning is output, as in the other
// formats' counts); a payload without either has no output count (the
// stream's first ones carry the prompt count alone). An "error" member is
// an error. The candidates are pooled (Choices -1). A response with
// several (generationConfig.candidateCount > 1, up to 8:
// https://ai.google.dev/api/rest/v1beta/GenerationConfig), a payload with
// more than one candidate or one whose index is not 0, pools their text
// and calls too: a Collector is marked Multi, and the structure checks
// do not read them, as for OpenAI's n > 1 (read as one answer, two valid
// JSON candidates were one invalid text).
func ParseGemini(data []byte, c *Chunk) { parseGemini(data, c, nil) }

// parseGemini is ParseGemini, writing to t (when not nil) the answer
// text: the text of every candidate's parts that are not thoughts.
func parseGemini(data []byte, c *Chunk, t *Collector) {
	*c = Chunk{Choices: -1}
	d := trimWS(data)
	var ok bool
	if len(d) > 0 && d[0] == '[' {
		bad := false
		ok = eachElement(d, func(v []byte) bool {
			bad = !geminiObject(v, c, t)
			return !bad
		}) && !bad
	} else {
		ok = geminiObject(d, c, t)
	}
	if !ok {
		*c = Chunk{Malformed: true, Choices: -1}
	}
}

// geminiObject folds one GenerateContentResponse (or error object) into
// c (its answer text into t when not nil); false when v is not an
// object.
func geminiObject(v []byte, c *Chunk, t *Collector) bool {
	var block []byte
	cands, other := 0, false // candidates, and whether one named an index but 0
	ok := eachMember(v, func(k, v []byte) bool {
		switch string(k) {
		case "candidates":
			eachElement(v, func(cand []byte) bool {
				cands++
				eachMember(cand, func(k, v []byte) bool {
					switch string(k) {
					case "index":
						other = other || string(v) != "0"
					case "content":
						eachMember(v, func(k, v []byte) bool {
							if string(k) == "parts" {
								eachElement(v, func(p []byte) bool { geminiPart(p, c, t); return true })
							}
							return true
						})
					case "finishReason":
						if s, ok := strVal(v); ok && len(s) > 0 && len(c.FinishReason) == 0 {
							c.FinishReason = s
						}
					}
					return true
				})
				return true
			})
		case "promptFeedback":
			eachMember(v, func(k, v []byte) bool {
				if string(k) == "blockReason" {
					block, _ = strVal(v)
				}
				return true
			})
		case "usageMetadata":
			readUsage(&usageGemini, v, c)
		case "modelVersion":
			c.Model, _ = strVal(v)
		case "responseId":
			c.ID, _ = strVal(v)
		case "error":
			c.Error = true
			geminiError(v, c)
		}
		return true
	})
	if len(c.FinishReason) == 0 && len(block) > 0 {
		c.FinishReason = block
	}
	if t != nil && (cands > 1 || other) {
		t.SetMulti()
	}
	return ok
}

func geminiPart(p []byte, c *Chunk, t *Collector) {
	var text, thought, call bool
	var textv, fcall []byte
	eachMember(p, func(k, v []byte) bool {
		switch string(k) {
		case "text":
			text = nonEmptyStr(v)
			textv = v
		case "thought":
			thought = boolVal(v)
		case "functionCall":
			call = isObject(v)
			fcall = v
		}
		return true
	})
	if t != nil && !thought {
		t.add(textv)
	}
	if t != nil && call { // a whole call in each part: {name, args}
		var name, args []byte
		eachMember(fcall, func(k, v []byte) bool {
			switch string(k) {
			case "name":
				name = v
			case "args":
				args = v
			}
			return true
		})
		t.callArgs(t.callName(newCall, name), args, false)
	}
	switch {
	case text && thought:
		c.Reasoning = true
	case text || call:
		c.Output = true
	}
}

// usageGemini: UsageMetadata; the reasoning (thoughtsTokenCount) is
// output, as in the other formats' counts.
var usageGemini = Usage{Input: []string{"promptTokenCount"}, Cached: []string{"cachedContentTokenCount"},
	Output: []string{"candidatesTokenCount"}, Reasoning: []string{"thoughtsTokenCount"}}

// geminiError reads Google's error object: code (the HTTP status) and
// status (RESOURCE_EXHAUSTED, UNAVAILABLE...: the error type).
func geminiError(v []byte, c *Chunk) {
	if s, ok := strVal(v); ok {
		c.ErrorType = s
		return
	}
	eachMember(v, func(k, v []byte) bool {
		switch string(k) {
		case "code":
			c.ErrorCode, _ = intVal(v)
		case "status":
			if s, ok := strVal(v); ok && len(s) > 0 {
				c.ErrorType = s
			}
		}
		return true
	})
}
