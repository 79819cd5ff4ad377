//! What sealing (encryption at rest) costs on SQLite: `get` and `put` of
//! credential records through a sealed store against the same operations
//! on the plain store, measured in one run on one database.
//!
//! Plain and sealed take turns operation by operation, in every task, so
//! that whatever else the machine does at a moment (a neighbour's build, a
//! slow disk flush) weighs on both alike, and group commits carry both
//! kinds; the sealed store is the plain one behind a seal, so the database,
//! its cache and its writer are the same. A rate is the tasks over the mean
//! time of one operation. The aim: sealed at 90% or more of plain. The last
//! line gives the cost of opening a sealed record alone.
//!
//! Run it in release mode: `cargo xtask bench sealing`, or
//! `cargo bench -p mcp-persist-store-sqlite --bench bench_sealing`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use mcp_persist_core::{
    ClientRegistration, CredentialKey, Credentials, KvStore, PutMode, PutOptions, Secret, declare,
    records::encode,
    seal::{Keyring, SealKey, Sealed, Sealing},
};
use mcp_persist_store_sqlite::SqliteStore;

/// How long each comparison runs.
const RUN: Duration = Duration::from_secs(3);
const KEYS: usize = 64;

fn record(i: usize) -> Result<Vec<u8>> {
    let creds = Credentials::new(
        CredentialKey::new(
            "https://auth.example.com",
            &format!("https://mcp{i}.example.com/mcp"),
        )?,
        Secret::new(format!("eyJhbGciOiJSUzI1NiJ9.{}", "a".repeat(400))),
        ClientRegistration::new("client-1").with_client_secret(Secret::new("s".repeat(40))),
    )
    .with_refresh_token(Secret::new("r".repeat(64)))
    .with_scopes(vec!["mcp:tools".into(), "mcp:resources".into()]);
    Ok(encode(&creds)?)
}

/// Credential keys; the plain store's and the sealed store's are apart.
fn key(sealed: bool, i: usize) -> mcp_persist_core::Key {
    let issuer = if sealed {
        "https://sealed.example.com"
    } else {
        "https://plain.example.com"
    };
    declare::CREDENTIALS.key(&[issuer, &format!("https://mcp{}.example.com/mcp", i % KEYS)])
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Put,
    Get,
}

async fn one(store: &dyn KvStore, sealed: bool, op: Op, i: usize, value: &[u8]) -> Result<()> {
    match op {
        Op::Put => {
            store
                .put(
                    &key(sealed, i),
                    value.to_vec(),
                    PutOptions::new(PutMode::Overwrite),
                )
                .await?;
        }
        Op::Get => {
            anyhow::ensure!(
                store.get(&key(sealed, i)).await?.is_some(),
                "written before"
            );
        }
    }
    Ok(())
}

/// `tasks` tasks each doing `op` on the plain and the sealed store in turn
/// for [`RUN`]; the two rates in operations per second.
async fn compare(
    plain: &Arc<dyn KvStore>,
    sealed: &Arc<dyn KvStore>,
    op: Op,
    tasks: usize,
    records: &Arc<Vec<Vec<u8>>>,
) -> Result<(f64, f64)> {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (plain, sealed, records) = (plain.clone(), sealed.clone(), records.clone());
            tokio::spawn(async move {
                let mut spent = [Duration::ZERO; 2];
                let mut done = 0;
                while start.elapsed() < RUN {
                    let i = task * 7919 + done;
                    let value = &records[i % records.len()];
                    // Alternate which goes first, so neither always follows the other.
                    let order = if done % 2 == 0 { [0, 1] } else { [1, 0] };
                    for slot in order {
                        let store = if slot == 0 { &plain } else { &sealed };
                        let t = Instant::now();
                        one(&**store, slot == 1, op, i, value).await?;
                        spent[slot] += t.elapsed();
                    }
                    done += 1;
                }
                Ok::<_, anyhow::Error>((done, spent))
            })
        })
        .collect();
    let (mut ops, mut spent) = (0usize, [Duration::ZERO; 2]);
    for handle in handles {
        let (done, s) = handle.await??;
        ops += done;
        spent[0] += s[0];
        spent[1] += s[1];
    }
    let rate = |spent: Duration| tasks as f64 * ops as f64 / spent.as_secs_f64();
    Ok((rate(spent[0]), rate(spent[1])))
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let store = Arc::new(SqliteStore::open(dir.path().join("store.db")).await?);
    let (key_material, _) = SealKey::generate()?;
    let sealing = Sealing::new(Keyring::new(key_material));
    let plain: Arc<dyn KvStore> = store.clone();
    let sealed: Arc<dyn KvStore> = Arc::new(Sealed::new(store.clone(), sealing.clone()));
    let records = Arc::new((0..KEYS).map(record).collect::<Result<Vec<_>>>()?);
    for i in 0..KEYS {
        for (s, is_sealed) in [(&plain, false), (&sealed, true)] {
            s.put(
                &key(is_sealed, i),
                records[i].clone(),
                PutOptions::default(),
            )
            .await?;
        }
    }

    let mut rows = Vec::new();
    for (what, tasks) in [("one task", 1), ("64 concurrent tasks", 64)] {
        for (name, op) in [("put", Op::Put), ("get", Op::Get)] {
            let (p, s) = compare(&plain, &sealed, op, tasks, &records).await?;
            rows.push((format!("{name}, {what}"), p, s));
        }
    }

    // Opening alone, no storage.
    let k = key(true, 0);
    let raw = store.get(&k).await?.context("stored")?.value;
    let ring = sealing.keyring();
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(200) {
        std::hint::black_box(ring.open(&k, std::hint::black_box(&raw))?);
        n += 1;
    }
    let open_micros = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);

    println!(
        "SQLite, WAL, synchronous=FULL, {}-byte credential records, AES-256-GCM (aws-lc-rs), {RUN:?} per row",
        records[0].len()
    );
    println!();
    println!(
        "| {:<28} | {:>10} | {:>10} | {:>8} |",
        "what", "plain/s", "sealed/s", "sealed"
    );
    println!("|{:-<30}|{:-<12}|{:-<12}|{:-<10}|", "", "", "", "");
    let mut worst = f64::INFINITY;
    for (what, p, s) in &rows {
        let ratio = s / p;
        worst = worst.min(ratio);
        println!(
            "| {what:<28} | {p:>10.0} | {s:>10.0} | {:>7.1}% |",
            ratio * 100.0
        );
    }
    println!();
    println!(
        "sealing: the slowest sealed operation runs at {:.1}% of plain (aim: at least 90%) {}",
        worst * 100.0,
        if worst >= 0.9 { "ok" } else { "BELOW THE AIM" }
    );
    println!("opening one sealed record alone takes {open_micros:.2} µs");
    Ok(())
}
