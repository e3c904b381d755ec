// test-server.cjs - drives a running gptoss-server with the official OpenAI Node SDK (run by
// tests/test-server.sh, which starts the server on the tiny model and passes its URL). The
// model's random text is never an expectation: replies are compared with other replies of the
// same server (same seed, same request → same text), and usage with what was sent.
'use strict';
const path = require('path');
const assert = require('assert/strict');
const OpenAI = require(path.join(process.env.OPENAI_NODE_DIR, 'node_modules', 'openai'));

const baseURL = process.env.SERVER_URL + '/v1';
const client = new OpenAI({ apiKey: process.env.SERVER_KEY, baseURL, maxRetries: 0 });
let failures = 0;

async function check(name, fn) {
  const start = Date.now();
  try {
    await fn();
    console.log(`ok: ${name} (${((Date.now() - start) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failures++;
    console.log(`FAIL: ${name}\n${e && e.stack ? e.stack : e}`);
  }
}

function user(text) { return [{ role: 'user', content: text }]; }

async function streamed(params, onChunk) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const acc = { content: '', reasoning: '', calls: [], finish: null, usage: null, chunks: 0 };
  for await (const chunk of stream) {
    acc.chunks++;
    if (onChunk && onChunk(chunk, stream) === false) break;
    if (chunk.usage) acc.usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (c.finish_reason) acc.finish = c.finish_reason;
    if (c.delta.content) acc.content += c.delta.content;
    if (c.delta.reasoning_content) acc.reasoning += c.delta.reasoning_content;
    for (const t of c.delta.tool_calls || []) {
      acc.calls[t.index] = acc.calls[t.index] || { id: '', name: '', arguments: '' };
      if (t.id) acc.calls[t.index].id = t.id;
      if (t.function && t.function.name) acc.calls[t.index].name += t.function.name;
      if (t.function && t.function.arguments) acc.calls[t.index].arguments += t.function.arguments;
    }
  }
  return acc;
}

async function health() {
  const r = await fetch(process.env.SERVER_URL + '/health');
  return r.json();
}

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

async function main() {
  await check('models.list names the served model', async () => {
    const list = await client.models.list();
    assert.deepEqual(list.data.map(m => m.id), [process.env.SERVER_ALIAS]);
  });

  let plain;
  const base = { model: 'whatever', messages: user('Say something.'), max_tokens: 12, seed: 42 };
  await check('a plain completion has an assistant message, finish_reason and usage', async () => {
    plain = await client.chat.completions.create(base);
    assert.equal(plain.object, 'chat.completion');
    assert.match(plain.id, /^chatcmpl-/);
    assert.equal(plain.model, process.env.SERVER_ALIAS);
    const c = plain.choices[0];
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
    const u = plain.usage;
    assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 12, JSON.stringify(u));
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    assert.ok(u.prompt_tokens > 3);
    assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
    assert.equal(c.finish_reason === 'length', u.completion_tokens === 12);
  });

  await check('the same request streamed adds up to the same reply, with usage last', async () => {
    const s = await streamed(base);
    assert.equal(s.content, plain.choices[0].message.content);
    assert.equal(s.reasoning, plain.choices[0].message.reasoning_content || '');
    assert.equal(s.finish, plain.choices[0].finish_reason);
    assert.equal(s.usage.completion_tokens, plain.usage.completion_tokens);
    assert.equal(s.usage.prompt_tokens, plain.usage.prompt_tokens);
  });

  await check('the next turn of a conversation reuses its prefix (cached_tokens)', async () => {
    const first = await client.chat.completions.create({ ...base, messages: user('Tell me a story.') });
    const next = await client.chat.completions.create({ ...base, messages: [
      ...user('Tell me a story.'), { role: 'assistant', content: first.choices[0].message.content },
      ...user('Another one.')] });
    assert.ok(next.usage.prompt_tokens > first.usage.prompt_tokens);
    assert.ok(next.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 8,
      `cached ${next.usage.prompt_tokens_details.cached_tokens} of the first turn's ${first.usage.prompt_tokens}`);
  });

  await check('a tool call round trip: tools, an assistant tool_calls message and the tool result', async () => {
    const messages = [...user('Weather in Paris?'),
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_abc', content: '{"temperature":21}' }];
    const withTools = await client.chat.completions.create({ ...base, messages, tools });
    const bare = await client.chat.completions.create({ ...base, messages: user('Weather in Paris?'), tools });
    const none = await client.chat.completions.create({ ...base, messages: user('Weather in Paris?'), tools, tool_choice: 'none' });
    assert.ok(withTools.usage.prompt_tokens > bare.usage.prompt_tokens + 10);
    assert.equal(none.usage.prompt_tokens, bare.usage.prompt_tokens, 'tool_choice none keeps the tools in the prompt');
    assert.equal(none.choices[0].message.tool_calls, undefined, 'tool_choice none: no tool call');
    const c = withTools.choices[0];
    assert.equal(c.message.role, 'assistant');
    for (const call of c.message.tool_calls || []) {  // the random model rarely calls; if it does, the shape holds
      assert.match(call.id, /^call_/);
      assert.equal(call.type, 'function');
      assert.equal(typeof call.function.arguments, 'string');
    }
    const s = await streamed({ ...base, messages, tools });
    assert.equal(s.content, c.message.content || '');
    assert.deepEqual(s.calls.map(t => [t.name, t.arguments]), (c.message.tool_calls || []).map(t => [t.function.name, t.function.arguments]));
  });

  await check('bad requests are 400 with the field named in param', async () => {
    const cases = [
      [{ ...base, temperature: 'hot' }, 'temperature'],
      [{ ...base, messages: [{ role: 'user', content: 5 }] }, 'messages[0].content'],
      [{ ...base, messages: [...user('a'), { role: 'tool', tool_call_id: 'nope', content: 'x' }] }, 'messages[1].tool_call_id'],
      [{ ...base, tool_choice: { type: 'function', function: { name: 'get_weather' } } }, 'tool_choice.function.name'],
      [{ ...base, response_format: { type: 'json_schema', json_schema: { schema: {} } } }, 'response_format.json_schema.name'],
      [{ ...base, n: 2 }, 'n'],
      [{ ...base, max_tokens: 0 }, 'max_tokens'],
    ];
    for (const [params, param] of cases) {
      await assert.rejects(client.chat.completions.create(params), e => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${param}: ${e}`);
        assert.equal(e.status, 400);
        assert.equal(e.param, param);
        assert.equal(e.type, 'invalid_request_error');
        assert.ok(e.message.includes(param), e.message);
        return true;
      });
    }
  });

  // With constrained decoding in libgptoss they are honoured (checked here on what the random
  // model writes under the constraint); without it, a 400 names the field.
  await check('tool_choice required / named and response_format json_schema: honoured, or 400 naming the field', async () => {
    const asks = [
      [{ tools, tool_choice: 'required' }, 'tool_choice'],
      [{ tools, tool_choice: { type: 'function', function: { name: 'get_weather' } } }, 'tool_choice'],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'answer',
        schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } } } }, 'response_format'],
    ];
    for (const [extra, param] of asks) {
      // 40 tokens: constrained sampling on the CPU is slow, and the random model rarely ends a
      // string, so only a prefix of the arguments is checked.
      const r = await client.chat.completions.create({ ...base, max_tokens: 40, ...extra }).catch(e => e);
      if (r instanceof Error) {
        assert.ok(r instanceof OpenAI.BadRequestError, String(r));
        assert.equal(r.param, param);
        assert.match(r.message, /not supported/);
        continue;
      }
      const c = r.choices[0];
      if (param === 'tool_choice') {
        // The header is forced: a call to get_weather whatever the random weights say.
        assert.equal(c.message.tool_calls.length, 1, JSON.stringify(c));
        const call = c.message.tool_calls[0];
        assert.equal(call.function.name, 'get_weather');
        assert.match(call.function.arguments, /^\s*(\{\s*("(c(i(ty?)?)?)?)?)?$|^\s*\{\s*"city"\s*(:|$)/, call.function.arguments);
        if (c.finish_reason === 'tool_calls') assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
        else assert.equal(c.finish_reason, 'length');
      } else if (c.finish_reason === 'stop') {
        assert.equal(typeof JSON.parse(c.message.content).a, 'number', c.message.content);
      }
    }
  });

  await check('a wrong API key is 401', async () => {
    const wrong = new OpenAI({ apiKey: 'wrong-key', baseURL, maxRetries: 0 });
    await assert.rejects(wrong.chat.completions.create(base), e => e instanceof OpenAI.AuthenticationError && e.status === 401);
    await assert.rejects(wrong.models.list(), e => e.status === 401);
  });

  await check('8 requests at once all complete, each with the reply it gets alone', async () => {
    const reqs = Array.from({ length: 8 }, (_, i) => ({ ...base, messages: user(`Request number ${i}.`), seed: 100 + i, max_tokens: 8 }));
    const alone = [];
    for (const r of reqs) alone.push(await client.chat.completions.create(r));
    const together = await Promise.all(reqs.map((r, i) => i % 2 ? streamed(r)
      : client.chat.completions.create(r).then(x => ({ content: x.choices[0].message.content, usage: x.usage }))));
    const distinct = new Set(alone.map(a => a.choices[0].message.content));
    assert.ok(distinct.size >= 6, 'different requests give different replies, so a mix-up would show');
    together.forEach((t, i) => {
      assert.equal(t.content, alone[i].choices[0].message.content, `request ${i}`);
      assert.equal(t.usage.completion_tokens, alone[i].usage.completion_tokens, `request ${i}`);
    });
  });

  await check('a client that disconnects mid-stream cancels its generation and frees its session', async () => {
    const controller = new AbortController();
    const stream = await client.chat.completions.create({ ...base, max_tokens: 5000, stream: true }, { signal: controller.signal });
    const it = stream[Symbol.asyncIterator]();
    await it.next();  // the first chunk: it is generating now
    assert.equal((await health()).busy, 1);
    controller.abort();
    await it.next().catch(() => {});
    let busy = 1;
    for (let i = 0; i < 50 && busy; i++) {
      await new Promise(r => setTimeout(r, 100));
      busy = (await health()).busy;
    }
    assert.equal(busy, 0, 'the session is still busy 5 s after the client left');
    const after = await client.chat.completions.create(base);
    assert.equal(after.choices[0].message.content, plain.choices[0].message.content);
  });

  console.log(failures ? `${failures} checks failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}

main().catch(e => { console.log(`FAIL: ${e.stack || e}`); process.exit(1); });
