// The official MCP Inspector CLI against two mcp-persist server instances
// sharing one store, behind a round-robin HTTP proxy (run by
// `cargo xtask interop`).
//
// Environment: C_URL and D_URL (the instances), INSPECTOR (the Inspector's
// launcher script). Prints summary lines starting with `INTEROP ` and exits
// 0 when every step held.
//
// Each Inspector run is one process (`--cli --transport http`): it connects,
// sends one method, prints the result as JSON and exits. The proxy sends
// every HTTP request to the next instance in turn and notes where each went,
// so one run's requests are served by both instances.
//
// 1. On each revision (2025-11-25, 2026-07-28): tools/list, and whoami,
//    which must name the Inspector itself (its `_meta` on 2026-07-28).
// 2. 2025-11-25: the session the Inspector's `initialize` created on one
//    instance is used on the other within the same run.
// 3. 2026-07-28: long_job runs as a task that the Inspector polls with
//    tasks/get on both instances, to its result.
// 4. 2026-07-28: ask_name asks for elicitation, which the Inspector did not
//    declare: the run ends with that error, within a second of a plain call.

import http from 'node:http';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const targets = [process.env.C_URL, process.env.D_URL].map((u) => new URL(u));
const INSPECTOR = process.env.INSPECTOR;
const report = [];
let ok = true;

function check(condition, what) {
  if (!condition) {
    ok = false;
    console.error(`FAILED: ${what}`);
  }
}

// A round-robin HTTP proxy; `seen` lists every request it forwarded.
function startProxy() {
  let next = 0;
  const seen = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const instance = next++ % targets.length;
      const target = targets[instance];
      let rpc;
      try {
        rpc = JSON.parse(body.toString('utf8'));
      } catch {}
      seen.push({
        instance,
        http: req.method,
        session: req.headers['mcp-session-id'],
        method: rpc?.method,
      });
      const upstream = http.request(
        {
          hostname: target.hostname,
          port: target.port,
          path: target.pathname,
          method: req.method,
          headers: { ...req.headers, host: target.host },
        },
        (answer) => {
          res.writeHead(answer.statusCode, answer.headers);
          answer.pipe(res);
        },
      );
      upstream.on('error', (e) => {
        if (!res.headersSent) res.writeHead(502);
        res.end(String(e));
      });
      res.on('close', () => upstream.destroy());
      upstream.end(body);
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({ url: `http://127.0.0.1:${port}/mcp`, seen, server });
    });
  });
}

const home = mkdtempSync(join(tmpdir(), 'mcp-persist-inspector-'));

// One Inspector CLI run; its JSON output, exit code and wall time.
function inspector(url, era, args) {
  const argv = [
    INSPECTOR,
    '--cli',
    url,
    '--transport',
    'http',
    '--protocol-era',
    era,
    '--header',
    'x-demo-user: ina',
    '--format',
    'json',
    ...args,
  ];
  const started = Date.now();
  return new Promise((resolve) => {
    // A home of its own: the Inspector keeps a catalog and settings there.
    const child = spawn(process.execPath, argv, {
      env: { ...process.env, HOME: home, MCP_CATALOG_PATH: join(home, 'mcp.json') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      const ms = Date.now() - started;
      let json;
      for (const text of [stdout, stderr]) {
        try {
          json = json ?? JSON.parse(text.trim());
        } catch {}
      }
      resolve({ code, json, ms, stdout, stderr });
    });
  });
}

function toolText(run) {
  return run.json?.result?.content?.[0]?.text ?? '';
}

const eras = { legacy: '2025-11-25', modern: '2026-07-28' };

try {
  const proxy = await startProxy();
  for (const [era, revision] of Object.entries(eras)) {
    // 1. tools/list and a tool call, through the proxy.
    const list = await inspector(proxy.url, era, ['--method', 'tools/list']);
    const names = (list.json?.result?.tools ?? []).map((t) => t.name);
    check(
      list.code === 0 && names.includes('whoami') && names.includes('long_job'),
      `${revision}: tools/list (exit ${list.code}, tools ${JSON.stringify(names)}) ${list.stderr}`,
    );
    const from = proxy.seen.length;
    const who = await inspector(proxy.url, era, ['--method', 'tools/call', '--tool-name', 'whoami']);
    let whoami = {};
    try {
      whoami = JSON.parse(toolText(who));
    } catch {}
    check(
      who.code === 0 && whoami.client === 'inspector-cli',
      `${revision}: whoami names the Inspector (got ${JSON.stringify(who.json ?? who.stderr)})`,
    );
    const line = { revision, tools: names.length, whoami: whoami.client, ms: who.ms };
    if (era === 'legacy') {
      // 2. The session the run created, used on both instances.
      const session = whoami.session;
      const served = new Set(
        proxy.seen.slice(from).filter((r) => r.session === session).map((r) => r.instance),
      );
      check(
        typeof session === 'string' && served.size === 2,
        `${revision}: session ${session} used on both instances (served by ${JSON.stringify([...served])})`,
      );
      line.sessionOnInstances = served.size;
    } else {
      // 3. A task polled across both instances.
      const before = proxy.seen.length;
      const job = await inspector(proxy.url, era, [
        '--method',
        'tools/call',
        '--tool-name',
        'long_job',
        '--tool-arg',
        'steps=6',
        'step_ms=100',
        'tag=inspector',
      ]);
      const polls = proxy.seen.slice(before).filter((r) => r.method === 'tasks/get');
      const pollers = new Set(polls.map((r) => r.instance));
      check(
        job.code === 0 && /job inspector done/.test(toolText(job)),
        `${revision}: long_job's result through the task (got ${JSON.stringify(job.json ?? job.stderr)})`,
      );
      check(
        pollers.size === 2,
        `${revision}: the task polled on both instances (${polls.length} polls on ${JSON.stringify([...pollers])})`,
      );
      line.taskPolls = polls.length;
      line.taskPolledOn = pollers.size;
      // 4. Elicitation the Inspector did not declare: an error at once.
      const ask = await inspector(proxy.url, era, ['--method', 'tools/call', '--tool-name', 'ask_name']);
      const message = ask.json?.error?.message ?? '';
      check(
        ask.code !== 0 && /`elicitation`/.test(message),
        `${revision}: ask_name refused with the missing capability (exit ${ask.code}, ${JSON.stringify(ask.json ?? ask.stderr)})`,
      );
      const extra = ask.ms - who.ms;
      check(extra < 1000, `${revision}: ask_name answered within a second of a plain call (${ask.ms} ms vs ${who.ms} ms)`);
      line.askName = { error: message, ms: ask.ms, plainCallMs: who.ms };
    }
    report.push(line);
  }
  proxy.server.close();
} catch (e) {
  ok = false;
  report.push({ exception: String(e?.stack ?? e) });
}
rmSync(home, { recursive: true, force: true });

for (const line of report) {
  if (line.exception) {
    console.log(`INTEROP the Inspector run failed: ${line.exception}`);
    continue;
  }
  let text = `INTEROP Inspector ${line.revision}: tools/list ${line.tools} tools; whoami ${JSON.stringify(line.whoami)} (${line.ms} ms)`;
  if (line.sessionOnInstances) text += `; its session used on ${line.sessionOnInstances} instances`;
  if (line.taskPolls !== undefined) text += `; long_job task polled ${line.taskPolls} times on ${line.taskPolledOn} instances`;
  if (line.askName) text += `; ask_name refused in ${line.askName.ms} ms (plain call ${line.askName.plainCallMs} ms): ${JSON.stringify(line.askName.error)}`;
  console.log(text);
}
process.exit(ok ? 0 : 1);
