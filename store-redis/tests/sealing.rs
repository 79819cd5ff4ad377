//! The sealing suite on a standalone Redis: no planted secret or key in
//! what Redis holds (every key's `DUMP`, its value, and every stream's
//! entries through `XRANGE`), swapped ciphertexts and wrong keys as typed
//! errors, rekey under load and after a SIGKILL, and the key-value and log
//! suites through the seal.

mod common;

use common::{Topology, URL_VAR, open_at};

/// Everything Redis holds under the place's prefix, as Redis has it.
async fn redis_bytes(place: mcp_persist_core::conformance::crash::Place) -> Vec<u8> {
    let url = std::env::var(URL_VAR).expect("the store was opened, so the URL is set");
    let client = redis::Client::open(url.trim()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let pattern = format!("test:{}:*", place.name);
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let mut raw = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DUMP");
        raw.extend(dump.unwrap_or_default());
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        // DUMP may compress: the values themselves as well.
        let value: redis::Value = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).query_async(&mut conn).await,
            "hash" => redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await,
            "stream" => {
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .query_async(&mut conn)
                    .await
            }
            "zset" => {
                redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await
            }
            _ => Ok(redis::Value::Nil),
        }
        .expect("read a value");
        flatten(&value, &mut raw);
    }
    raw
}

fn flatten(value: &redis::Value, out: &mut Vec<u8>) {
    match value {
        redis::Value::BulkString(bytes) => out.extend_from_slice(bytes),
        redis::Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|v| flatten(v, out))
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        _ => {}
    }
}

mcp_persist_core::seal_conformance!(
    open: |place| open_at(Topology::Standalone, place),
    raw: redis_bytes,
);
