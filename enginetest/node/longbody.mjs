// One streamed chat request with a long body through the Vercel AI SDK
// (streamText with its OpenAI-compatible provider), as an application
// sends it: the SDK writes "stream" after "messages".
//
// usage: node longbody.mjs BASE_URL MODEL PROMPT_BYTES PAD_BYTES MAX_TOKENS
// The first user message is PROMPT_BYTES of words; PAD_BYTES more go in a
// "padding" member, which the provider puts before "messages" (extra
// provider options) and the engine ignores (longbody_test.go says why).
// It prints one JSON line: the text the SDK assembled, its finish reason,
// the top-level keys of the body it sent, in order, and the body's size.
import { streamText } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';

const [baseURL, model, promptBytes, padBytes, maxTokens] = process.argv.slice(2);
let sent = '';
const provider = createOpenAICompatible({
  name: 'ollama',
  baseURL,
  apiKey: 'ollama',
  fetch: (url, init) => {
    sent = init.body;
    return fetch(url, init);
  },
});
const words = 'lorem ipsum dolor sit amet ';
const text = (n) => words.repeat(Math.ceil(n / words.length) + 1).slice(0, n);
const long = text(Number(promptBytes));
let failed = null;
const result = streamText({
  model: provider.chatModel(model),
  messages: [
    { role: 'user', content: long },
    { role: 'assistant', content: 'ok' },
    { role: 'user', content: 'Say something.' },
  ],
  maxOutputTokens: Number(maxTokens),
  temperature: 0,
  maxRetries: 0,
  providerOptions: { ollama: { padding: text(Number(padBytes)) } },
  onError: ({ error }) => { failed = error; },
});
let answer = '';
for await (const delta of result.textStream) answer += delta;
if (failed) {
  console.error(String(failed?.stack ?? failed));
  process.exit(1);
}
console.log(JSON.stringify({
  text: answer,
  finishReason: await result.finishReason,
  keys: Object.keys(JSON.parse(sent)),
  bodyBytes: Buffer.byteLength(sent),
}));
