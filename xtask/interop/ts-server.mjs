// An MCP server written with the official TypeScript SDK, for the durable
// client's side of the interop run (started by `cargo xtask interop`).
//
// It knows nothing of this product: the idempotency key the durable client
// puts in a call's `_meta` is ignored, and it does not advertise exactly-once
// calls. Two endpoints on one port:
//
// * `/stateless`: no sessions (`sessionIdGenerator: undefined`, a new server
//   and transport per request), the way the SDK deploys serverless;
// * `/mcp`: sessions kept in memory, no event store (its SSE events carry
//   no ids, so nothing can be resumed).
//
// One tool, `charge {tag, delay_ms}`: appends `charge TAG` to RUNS_FILE,
// waits `delay_ms`, answers `charge TAG: run N (key in _meta: yes|no)`.
// Prints `LISTENING <port>` once it accepts connections.

import { appendFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

const RUNS_FILE = process.env.RUNS_FILE;
const KEY = 'io.mcp-persist/idempotencyKey';
let runs = 0;

function mcpServer() {
  const server = new McpServer({ name: 'ts-interop-server', version: '1.0.0' });
  server.registerTool(
    'charge',
    {
      description: 'Notes a run in the runs file, waits delay_ms, answers which run it was.',
      inputSchema: { tag: z.string(), delay_ms: z.number().optional() },
    },
    async ({ tag, delay_ms }, extra) => {
      runs += 1;
      const run = runs;
      appendFileSync(RUNS_FILE, `charge ${tag}\n`);
      await new Promise((resolve) => setTimeout(resolve, Math.min(delay_ms ?? 0, 60000)));
      const keyed = typeof extra?._meta?.[KEY] === 'string' ? 'yes' : 'no';
      return { content: [{ type: 'text', text: `charge ${tag}: run ${run} (key in _meta: ${keyed})` }] };
    },
  );
  return server;
}

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  return text ? JSON.parse(text) : undefined;
}

const sessions = new Map();

const http = createServer(async (req, res) => {
  try {
    const path = new URL(req.url, 'http://localhost').pathname;
    if (path === '/stateless') {
      if (req.method !== 'POST') {
        res.writeHead(405).end();
        return;
      }
      const server = mcpServer();
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
      res.on('close', () => {
        transport.close();
        server.close();
      });
      await server.connect(transport);
      await transport.handleRequest(req, res, await body(req));
      return;
    }
    if (path === '/mcp') {
      const id = req.headers['mcp-session-id'];
      let transport = id ? sessions.get(id) : undefined;
      if (!transport) {
        if (id) {
          res.writeHead(404).end();
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (sid) => sessions.set(sid, transport),
        });
        await mcpServer().connect(transport);
      }
      await transport.handleRequest(req, res, req.method === 'POST' ? await body(req) : undefined);
      return;
    }
    res.writeHead(404).end();
  } catch (e) {
    console.error(`ts-server: ${e?.stack ?? e}`);
    if (!res.headersSent) res.writeHead(500).end();
  }
});

http.listen(0, '127.0.0.1', () => {
  console.log(`LISTENING ${http.address().port}`);
});
