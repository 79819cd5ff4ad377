//! The Lua scripts behind every multi-step operation. Redis runs a script
//! atomically, and each one touches keys of a single hash tag only, so it runs
//! the same on a standalone server and on a Cluster.

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value, aio::ConnectionLike};

/// A script and its SHA-1, sent with `EVALSHA` and, when the server does not
/// have it cached (after a restart, or on a new Cluster node), with `EVAL`.
pub(crate) struct Lua {
    body: &'static str,
    sha: String,
}

impl Lua {
    fn new(body: &'static str) -> Self {
        Lua {
            body,
            sha: redis::Script::new(body).get_hash().to_owned(),
        }
    }

    fn cmd(&self, verb: &str, script: &str, keys: &[&[u8]], args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(script).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    /// Runs the script on the node owning `keys` (which share one slot).
    pub(crate) async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> RedisResult<Value> {
        match self
            .cmd("EVALSHA", &self.sha, keys, args)
            .query_async(conn)
            .await
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!(sha = %self.sha, "script not cached on the server; sending it");
                self.cmd("EVAL", self.body, keys, args)
                    .query_async(conn)
                    .await
            }
            other => other,
        }
    }
}

/// Status codes the key-value scripts return first.
pub(crate) const OK: i64 = 0;
pub(crate) const EXISTS: i64 = 1;
pub(crate) const CONFLICT: i64 = 2;
pub(crate) const CORRUPT: i64 = 3;

/// `put`: compare-and-swap of a record stored as `<version>:<value>`.
///
/// KEYS: record, version companion. ARGV: mode (`o` overwrite, `c` create,
/// `u` update), expected version (for `u`), value, TTL in ms (empty: none),
/// companion TTL in ms.
///
/// The new version is the server clock in microseconds, or one above the
/// last version of the key when the clock is behind it. The last version
/// comes from the live record or, once the record is deleted or expired, from
/// the companion, which outlives the record by a grace period; past that,
/// the clock alone keeps versions above any handed out before. Versions stay
/// below 2^53, so Lua's numbers hold them exactly; they are compared as
/// strings.
pub(crate) static PUT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local cur = redis.call('GET', KEYS[1])
local curv = nil
if cur then
  local sep = string.find(cur, ':', 1, true)
  if not sep or sep == 1 or sep > 21 then return {3} end
  curv = string.sub(cur, 1, sep - 1)
  if not string.match(curv, '^%d+$') then return {3} end
end
local mode = ARGV[1]
if mode == 'c' and curv then return {1} end
if mode == 'u' and curv ~= ARGV[2] then return {2} end
local last = tonumber(curv or redis.call('GET', KEYS[2]) or '0') or 0
local t = redis.call('TIME')
local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
if v <= last then v = last + 1 end
local vs = string.format('%.0f', v)
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[1], vs .. ':' .. ARGV[3], 'PX', ARGV[4])
  redis.call('SET', KEYS[2], vs, 'PX', ARGV[5])
else
  redis.call('SET', KEYS[1], vs .. ':' .. ARGV[3])
  redis.call('DEL', KEYS[2])
end
return {0, vs}
"#,
    )
});

/// `delete`, optionally only at an expected version.
///
/// KEYS: record, version companion. ARGV: expected version (empty: any),
/// grace period in ms for the companion. Returns `{0, deleted}` or `{2}`.
pub(crate) static DELETE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local cur = redis.call('GET', KEYS[1])
local curv = nil
if cur then
  local sep = string.find(cur, ':', 1, true)
  if sep and sep > 1 and sep <= 21 then
    curv = string.sub(cur, 1, sep - 1)
    if not string.match(curv, '^%d+$') then curv = nil end
  end
end
if ARGV[1] ~= '' and curv ~= ARGV[1] then return {2} end
if not cur then return {0, 0} end
redis.call('DEL', KEYS[1])
if curv then redis.call('SET', KEYS[2], curv, 'PX', ARGV[2]) end
return {0, 1}
"#,
    )
});

/// `next_seq`: the last id Redis generated for a log's stream, which the
/// next `XADD ... 0-*` goes one above. Redis keeps it through `XTRIM` and
/// `XDEL`, so it covers trimmed records too; it goes with the key (a delete
/// or an expiry). Reads only: `TYPE`, then `XINFO STREAM`, in one atomic
/// step, so the key cannot expire or change type between the two.
///
/// KEYS: the stream. Returns `{0}` when there is no such key, `{0, id}` for a
/// stream, `{3}` for a key of another type.
pub(crate) static LAST_ID: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {0} end
if kind ~= 'stream' then return {3} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info - 1, 2 do
  if info[i] == 'last-generated-id' then return {0, info[i + 1]} end
end
return redis.error_reply('XINFO STREAM gave no last-generated-id')
"#,
    )
});

/// `append` of a batch of appends, in order. For each: its records are
/// `XADD`ed with ids `0-<seq>` (Redis picks the next sequence number) and,
/// when it has an expiry and every `XADD` succeeded, its log gets that expiry
/// (`PEXPIRE`). The script runs atomically, so every append adds its records
/// and refreshes its expiry in one step.
///
/// KEYS: each append's stream (repeated for appends to the same log). ARGV,
/// per append: its expiry in ms (empty: keep the log's), its record
/// count, its records. Returns one flat array: per append, its ids, or, when
/// Redis refused an `XADD` (a key of another type), the ids before it and
/// then the error text prefixed with `!`. A refused first `XADD` leaves the
/// log untouched, its expiry included, and fails no other append.
pub(crate) static APPEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local out = {}
local a = 1
for k = 1, #KEYS do
  local key = KEYS[k]
  local ttl = ARGV[a]
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  local ok = true
  for j = 0, n - 1 do
    local id = redis.pcall('XADD', key, '0-*', 'd', ARGV[a + j])
    if type(id) == 'table' then
      out[#out + 1] = '!' .. tostring(id.err)
      ok = false
      break
    end
    out[#out + 1] = id
  end
  a = a + n
  if ok and ttl ~= '' then redis.call('PEXPIRE', key, ttl) end
end
return out
"#,
    )
});
