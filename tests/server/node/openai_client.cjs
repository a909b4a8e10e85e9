// Drives a running pagedattn server with the official OpenAI Node client (npm package `openai`,
// installed at test set-up; its directory in OPENAI_MODULE_DIR). Usage:
//   node openai_client.cjs <base url> <expected.json>
// expected.json (written by the C++ test from its greedy reference): {"model", "chat_prompt",
// "chat_text", "completion_prompt", "completion_text", "max_tokens"} and optionally
// "chat_token_bytes" / "chat_token_strings" (each chat token's logprobs bytes and token), and
// "batch_prompts" / "batch_texts" / "batch_logprob_sums" (a batch of token-id prompts scored as
// lm-evaluation-harness does: echo, logprobs 1, max_tokens 1; each choice's text, and the sum of
// its prompt tokens' logprobs after the first). Every check that fails is printed; the exit code
// is the number of failures (0: all passed).
// With "tools" in expected.json the tool-calling run replaces it: {"model", "tools", "content",
// "calls": [{"name", "arguments"}]}: the model writes those calls, which the client must parse
// from the non-streaming response, from the raw stream and through the SDK's own stream helper
// (which assembles tool-call deltas itself), and the assistant message sent back must be taken.
'use strict';
const fs = require('fs');
const OpenAI = require(process.env.OPENAI_MODULE_DIR);

const [baseURL, expectedPath] = process.argv.slice(2);
const expected = JSON.parse(fs.readFileSync(expectedPath, 'utf8'));
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
let failures = 0;
let checks = 0;
function check(condition, what, detail) {
  ++checks;
  if (!condition) {
    ++failures;
    console.log(`FAIL: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`);
  }
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === expected.model, 'models.list', models.data);

  const common = { model: expected.model, temperature: 0, max_tokens: expected.max_tokens,
                   ignore_eos: true };
  const chat = await client.chat.completions.create({
    ...common, messages: [{ role: 'user', content: expected.chat_prompt }] });
  check(chat.object === 'chat.completion', 'chat object', chat.object);
  check(chat.choices[0].message.role === 'assistant', 'chat role', chat.choices[0].message);
  check(chat.choices[0].message.content === expected.chat_text, 'chat text',
        [chat.choices[0].message.content, expected.chat_text]);
  check(chat.choices[0].finish_reason === 'length', 'chat finish', chat.choices[0].finish_reason);
  check(chat.usage.completion_tokens === expected.max_tokens, 'chat usage', chat.usage);

  // Logprobs: `bytes` are each token's raw bytes (a byte token >= 0x80 is part of a character),
  // `token` their text or, when not UTF-8, "bytes:\xNN".
  const scored = await client.chat.completions.create({
    ...common, messages: [{ role: 'user', content: expected.chat_prompt }], logprobs: true,
    top_logprobs: 2 });
  const content = scored.choices[0].logprobs.content;
  check(content.length === expected.max_tokens, 'logprobs count', content.length);
  check(content.every((item) => Array.isArray(item.bytes) && typeof item.token === 'string' &&
                                item.top_logprobs.length === 2 &&
                                item.top_logprobs[0].logprob === item.logprob),
        'logprobs: bytes, token, two alternatives, the chosen token first');
  if (expected.chat_token_bytes) {
    check(JSON.stringify(content.map((item) => item.bytes)) ===
          JSON.stringify(expected.chat_token_bytes), 'logprobs bytes',
          content.map((item) => item.bytes));
    check(JSON.stringify(content.map((item) => item.token)) ===
          JSON.stringify(expected.chat_token_strings), 'logprobs tokens',
          content.map((item) => item.token));
  }
  check(scored.choices[0].message.content === expected.chat_text, 'logprobs text');

  const stream = await client.chat.completions.create({
    ...common, messages: [{ role: 'user', content: expected.chat_prompt }], stream: true,
    stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    check(chunk.object === 'chat.completion.chunk', 'chunk object', chunk.object);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) text += choice.delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(role === 'assistant', 'stream role', role);
  check(text === expected.chat_text, 'stream text', [text, expected.chat_text]);
  check(finish === 'length', 'stream finish', finish);
  check(usage && usage.completion_tokens === expected.max_tokens, 'stream usage', usage);

  const completion = await client.completions.create({ ...common, prompt: expected.completion_prompt });
  check(completion.object === 'text_completion', 'completion object', completion.object);
  check(completion.choices[0].text === expected.completion_text, 'completion text',
        [completion.choices[0].text, expected.completion_text]);

  const completionStream = await client.completions.create({
    ...common, prompt: expected.completion_prompt, stream: true });
  let streamed = '';
  for await (const chunk of completionStream) {
    for (const choice of chunk.choices) streamed += choice.text;
  }
  check(streamed === expected.completion_text, 'completion stream text',
        [streamed, expected.completion_text]);

  // Hang up mid-stream: the client aborts; the server must go on serving.
  const cut = await client.chat.completions.create({
    ...common, max_tokens: 200, messages: [{ role: 'user', content: 'long' }], stream: true });
  let seen = 0;
  for await (const chunk of cut) {
    if (++seen === 3) { cut.controller.abort(); break; }
  }
  check(seen === 3, 'aborted stream', seen);

  try {
    await client.chat.completions.create({ model: 'no-such-model',
                                            messages: [{ role: 'user', content: 'x' }] });
    check(false, 'unknown model accepted');
  } catch (error) {
    check(error instanceof OpenAI.NotFoundError, 'unknown model -> NotFoundError', error.status);
    check(error.code === 'model_not_found', 'unknown model code', error.code);
  }
  try {
    await client.chat.completions.create({ ...common, messages: [] });
    check(false, 'empty messages accepted');
  } catch (error) {
    check(error instanceof OpenAI.BadRequestError, 'empty messages -> BadRequestError', error.status);
    check(error.param === 'messages', 'empty messages param', error.param);
  }
  if (expected.batch_prompts) {
    const scoredBatch = await client.completions.create({
      model: expected.model, prompt: expected.batch_prompts, echo: true, logprobs: 1,
      max_tokens: 1, temperature: 0, seed: 1234 });
    check(scoredBatch.choices.length === expected.batch_prompts.length, 'batch choices',
          scoredBatch.choices.length);
    scoredBatch.choices.forEach((choice, i) => {
      const logprobs = choice.logprobs;
      const length = expected.batch_prompts[i].length;
      check(choice.index === i, `batch index ${i}`, choice.index);
      check(choice.text === expected.batch_texts[i], `batch text ${i}`,
            [choice.text, expected.batch_texts[i]]);
      check(logprobs.token_logprobs.length === length + 1 && logprobs.tokens.length === length + 1 &&
            logprobs.text_offset.length === length + 1, `batch logprobs length ${i}`,
            logprobs.token_logprobs.length);
      check(logprobs.token_logprobs[0] === null && logprobs.top_logprobs[0] === null,
            `batch first prompt token null ${i}`);
      // lm-evaluation-harness' sum: the prompt's tokens after the first, not the generated one.
      const sum = logprobs.token_logprobs.slice(1, length).reduce((a, b) => a + b, 0);
      check(Math.abs(sum - expected.batch_logprob_sums[i]) < 1e-4, `batch logprob sum ${i}`,
            [sum, expected.batch_logprob_sums[i]]);
    });
    check(scoredBatch.usage.completion_tokens === expected.batch_prompts.length, 'batch usage',
          scoredBatch.usage);
  }
  const again = await client.completions.create({ ...common, prompt: expected.completion_prompt });
  check(again.choices[0].text === expected.completion_text, 'serving after errors');
}

// JSON with object keys sorted (expected.json is written with sorted keys).
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value);
}

async function toolsMain() {
  const request = { model: expected.model, temperature: 0, max_tokens: 400, tools: expected.tools,
                    messages: [{ role: 'user', content: 'Weather in Paris? And search Tokyo.' }] };
  const sameCalls = (calls, what) => {
    check(Array.isArray(calls) && calls.length === expected.calls.length, `${what}: count`, calls);
    if (!Array.isArray(calls)) return;
    calls.forEach((call, i) => {
      const want = expected.calls[i] || {};
      check(call.type === 'function' && typeof call.id === 'string' && call.id.startsWith('call_'),
            `${what}: call ${i} id and type`, call);
      check(call.function.name === want.name, `${what}: call ${i} name`, call.function);
      check(canonical(JSON.parse(call.function.arguments)) === canonical(want.arguments),
            `${what}: call ${i} arguments`, call.function.arguments);
    });
  };

  const chat = await client.chat.completions.create(request);
  const message = chat.choices[0].message;
  check(message.content === expected.content, 'tools: content', message.content);
  sameCalls(message.tool_calls, 'tools');
  check(chat.choices[0].finish_reason === 'tool_calls', 'tools: finish', chat.choices[0].finish_reason);

  // The raw stream, assembled by hand as the API reference describes the deltas.
  const stream = await client.chat.completions.create({ ...request, stream: true });
  let content = '';
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (choice.delta.content) content += choice.delta.content;
      for (const delta of choice.delta.tool_calls || []) {
        if (!calls[delta.index]) {
          calls[delta.index] = { id: delta.id, type: delta.type,
                                 function: { name: delta.function.name, arguments: '' } };
        }
        calls[delta.index].function.arguments += delta.function.arguments || '';
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(content === (expected.content || ''), 'tools stream: content', content);
  sameCalls(calls, 'tools stream');
  check(finish === 'tool_calls', 'tools stream: finish', finish);

  // The SDK's stream helper assembles the deltas itself (and refuses malformed ones).
  const helper = client.beta.chat.completions.stream(request);
  const final = await helper.finalChatCompletion();
  sameCalls(final.choices[0].message.tool_calls, 'tools stream helper');
  check(final.choices[0].finish_reason === 'tool_calls', 'tools stream helper: finish',
        final.choices[0].finish_reason);

  // The conversation continues with the assistant message as the SDK returned it.
  const followUp = await client.chat.completions.create({
    ...request, tool_choice: 'none',
    messages: [...request.messages, message,
               ...message.tool_calls.map((call) => ({ role: 'tool', tool_call_id: call.id,
                                                       content: '{"ok": true}' }))] });
  check(followUp.choices[0].finish_reason === 'stop', 'tools follow-up: finish',
        followUp.choices[0].finish_reason);
  check(!followUp.choices[0].message.tool_calls, 'tools follow-up: tool_choice none parses nothing',
        followUp.choices[0].message);

  try {
    await client.chat.completions.create({ ...request, tool_choice: 'required' });
    check(false, 'tool_choice required accepted');
  } catch (error) {
    check(error instanceof OpenAI.BadRequestError && error.param === 'tool_choice',
          'tool_choice required -> BadRequestError naming tool_choice', [error.status, error.param]);
  }
}

(expected.tools ? toolsMain() : main()).then(() => {
  console.log(`${checks - failures} passed, ${failures} failed`);
  process.exit(failures === 0 ? 0 : 1);
}, (error) => {
  console.log(`FAIL: uncaught ${error && error.stack ? error.stack : error}`);
  process.exit(2);
});
