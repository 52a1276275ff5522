// One streamed chat request with a long prompt through the Vercel AI SDK
// (streamText with its OpenAI-compatible provider), as an application
// sends it: the SDK writes "stream" after "messages".
//
// usage: node longbody.mjs BASE_URL MODEL PROMPT_BYTES MAX_TOKENS
// It prints one JSON line: the text the SDK assembled, its finish reason,
// the top-level keys of the body it sent, in order, and the body's size.
import { streamText } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';

const [baseURL, model, promptBytes, maxTokens] = process.argv.slice(2);
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
const long = words.repeat(Math.ceil(Number(promptBytes) / words.length)).slice(0, Number(promptBytes));
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
  onError: ({ error }) => { failed = error; },
});
let text = '';
for await (const delta of result.textStream) text += delta;
if (failed) {
  console.error(String(failed?.stack ?? failed));
  process.exit(1);
}
console.log(JSON.stringify({
  text,
  finishReason: await result.finishReason,
  keys: Object.keys(JSON.parse(sent)),
  bodyBytes: Buffer.byteLength(sent),
}));
