// The official TypeScript SDK's client against two mcp-persist server
// instances sharing one store (run by `cargo xtask interop`).
//
// Environment: A_URL and B_URL (the instances), A_PID (instance A's process,
// killed here with SIGKILL in the last scenario), C_URL and D_URL (two more
// instances on another store, whose resumed streams wait 400 ms at most for
// a new event). Prints summary lines starting with `INTEROP ` and exits 0
// when every scenario held.
//
// 1. resume: a call runs on A; the client's connections are cut and it
//    carries on at B, which tails the stream A still writes. Every progress
//    notification must arrive exactly once, then the answer.
// 2. foreign: another principal presenting the session id is refused (404).
// 3. orphan: a call runs on A; A is killed; the client resuming at B gets
//    the orphan error for its call, and how long after the kill is reported.
// 4. silent: a call runs on C, its progress 1.2 s apart; the client moves to
//    D, whose resumed streams end after 400 ms without a new event. The
//    client only keeps the ids it saw on the stream it reads, so each
//    resumed stream must name its place (a priming event with the
//    resumed-from id): every progress notification and the answer arrive
//    exactly once.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const A = process.env.A_URL;
const B = process.env.B_URL;
const A_PID = Number(process.env.A_PID);
const C = process.env.C_URL;
const D = process.env.D_URL;
const report = {};
let ok = true;

function check(condition, what) {
  if (!condition) {
    ok = false;
    console.error(`FAILED: ${what}`);
  }
}

// A fetch that sends every request to the current target and can cut all
// open connections, as a load balancer moving the client would.
function movableFetch(start) {
  let target = new URL(start);
  const open = new Set();
  const resumes = [];
  const fetchFn = async (input, init = {}) => {
    const url = new URL(typeof input === 'string' ? input : input.url ?? String(input));
    url.protocol = target.protocol;
    url.host = target.host;
    if ((init.method ?? 'GET') === 'GET') {
      const headers = new Headers(init.headers ?? {});
      resumes.push(headers.get('last-event-id'));
    }
    const controller = new AbortController();
    if (init.signal) {
      if (init.signal.aborted) controller.abort();
      init.signal.addEventListener('abort', () => controller.abort());
    }
    open.add(controller);
    return fetch(url, { ...init, signal: controller.signal });
  };
  const moveTo = (next) => {
    target = new URL(next);
    for (const c of open) c.abort();
    open.clear();
  };
  return { fetchFn, moveTo, resumes };
}

async function connect(user, start) {
  const movable = movableFetch(start);
  const transport = new StreamableHTTPClientTransport(new URL(start), {
    fetch: movable.fetchFn,
    requestInit: { headers: { 'x-demo-user': user } },
    reconnectionOptions: {
      initialReconnectionDelay: 100,
      maxReconnectionDelay: 1000,
      reconnectionDelayGrowFactor: 1.5,
      maxRetries: 30,
    },
  });
  const client = new Client({ name: 'interop-ts', version: '1.0.0' }, { capabilities: {} });
  await client.connect(transport);
  return { client, transport, moveTo: movable.moveTo, resumes: movable.resumes };
}

async function resume() {
  const { client, transport, moveTo } = await connect('alice', A);
  const count = 40;
  const seen = [];
  let moved = false;
  const call = client.callTool(
    { name: 'slow_progress', arguments: { count, delay_ms: 50, tag: 'interop' } },
    undefined,
    {
      timeout: 60_000,
      resetTimeoutOnProgress: true,
      onprogress: (p) => {
        seen.push(p.progress);
        if (!moved && seen.length === 10) {
          moved = true;
          // Cut every connection to A; from now on requests go to B.
          setTimeout(() => moveTo(B), 0);
        }
      },
    },
  );
  const result = await call;
  const text = result.content?.[0]?.text ?? '';
  const expected = Array.from({ length: count }, (_, i) => i + 1);
  const exactlyOnce = JSON.stringify(seen) === JSON.stringify(expected);
  report.resume = { progress: seen.length, exactlyOnce, answer: text, moved };
  check(moved, 'resume: the client was moved to B mid-call');
  check(exactlyOnce, `resume: progress exactly once in order (got ${JSON.stringify(seen)})`);
  check(text === 'done interop', `resume: the answer (got ${JSON.stringify(text)})`);
  return { client, transport };
}

async function foreign(sessionId) {
  const response = await fetch(B, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': sessionId,
      'mcp-protocol-version': '2025-11-25',
      'x-demo-user': 'mallory',
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
  });
  report.foreign = { status: response.status };
  check(response.status === 404, `foreign: another principal is refused with 404 (got ${response.status})`);
}

async function orphan() {
  const { client, moveTo } = await connect('alice', A);
  let killedAt = 0;
  let progress = 0;
  let outcome;
  try {
    await client.callTool(
      { name: 'slow_progress', arguments: { count: 1000, delay_ms: 50, tag: 'orphan' } },
      undefined,
      {
        timeout: 60_000,
        resetTimeoutOnProgress: true,
        onprogress: () => {
          progress += 1;
          if (progress === 5 && !killedAt) {
            process.kill(A_PID, 'SIGKILL');
            killedAt = Date.now();
            setTimeout(() => moveTo(B), 0);
          }
        },
      },
    );
    outcome = { answered: true };
  } catch (e) {
    outcome = { error: String(e?.message ?? e), code: e?.code };
  }
  const ms = killedAt ? Date.now() - killedAt : null;
  report.orphan = { ...outcome, msFromKill: ms };
  check(!outcome.answered, 'orphan: a killed instance\'s call must not complete');
  check(/re-issue/.test(outcome.error ?? ''), `orphan: the orphan error (got ${JSON.stringify(outcome)})`);
  await client.close().catch(() => {});
}

async function silent() {
  const { client, transport, moveTo, resumes } = await connect('carol', C);
  // Every answer the transport hands the client, to see the call's once.
  const answers = [];
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    if (message.result?.content?.[0]?.text === 'done silent') answers.push(message.id);
    deliver?.(message, extra);
  };
  const count = 5;
  const seen = [];
  let moved = false;
  let movedAt = 0;
  let outcome;
  try {
    const result = await client.callTool(
      { name: 'slow_progress', arguments: { count, delay_ms: 1200, tag: 'silent' } },
      undefined,
      {
        timeout: 15_000,
        resetTimeoutOnProgress: true,
        onprogress: (p) => {
          seen.push(p.progress);
          if (!moved) {
            moved = true;
            movedAt = resumes.length;
            setTimeout(() => moveTo(D), 0);
          }
        },
      },
    );
    outcome = { answer: result.content?.[0]?.text ?? '' };
  } catch (e) {
    outcome = { error: String(e?.message ?? e) };
  }
  const expected = Array.from({ length: count }, (_, i) => i + 1);
  const exactlyOnce = JSON.stringify(seen) === JSON.stringify(expected);
  // Resumptions after the move that named an event id: more than the
  // number of progress notifications means some streams ended silently.
  const resumed = resumes.slice(movedAt).filter((id) => id).length;
  report.silent = { progress: seen, exactlyOnce, answers: answers.length, resumed, ...outcome };
  check(outcome.answer === 'done silent', `silent: the answer (got ${JSON.stringify(outcome)})`);
  check(exactlyOnce, `silent: progress exactly once in order (got ${JSON.stringify(seen)})`);
  check(answers.length === 1, `silent: the answer exactly once (got ${answers.length})`);
  check(resumed > count - 1, `silent: some resumed streams ended without a new event (resumed ${resumed} times)`);
  await client.close().catch(() => {});
}

try {
  await silent();
  const { client, transport } = await resume();
  await foreign(transport.sessionId);
  await client.close().catch(() => {});
  await orphan();
} catch (e) {
  ok = false;
  report.exception = String(e?.stack ?? e);
}
const r = report;
if (r.resume) {
  console.log(`INTEROP resumed on B: ${r.resume.progress} progress notifications, exactly once in order: ${r.resume.exactlyOnce}; answer ${JSON.stringify(r.resume.answer)}`);
}
if (r.foreign) {
  console.log(`INTEROP another principal presenting the session: HTTP ${r.foreign.status}`);
}
if (r.orphan) {
  console.log(`INTEROP killed instance's call: ${JSON.stringify(r.orphan.error ?? 'answered')} ${r.orphan.msFromKill} ms after the kill`);
}
if (r.silent) {
  console.log(`INTEROP resumed streams ending silently (400 ms tail, 1.2 s between events): ${r.silent.resumed} resumptions with Last-Event-ID, progress ${JSON.stringify(r.silent.progress)}, exactly once: ${r.silent.exactlyOnce}; answer ${JSON.stringify(r.silent.answer ?? r.silent.error)} received ${r.silent.answers} time(s)`);
}
if (r.exception) {
  console.log(`INTEROP the client failed: ${r.exception}`);
}
process.exit(ok ? 0 : 1);
