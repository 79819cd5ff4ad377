//! Exactly-once calls under random SIGKILLs of either side, in a loop.
//!
//! Two durable server processes share a SQLite store behind a load
//! balancer; each round a fresh client process (the durable client, on its
//! own SQLite journal, in the 2026-07-28 era) first recovers what the
//! previous round left, then calls `charge` (never to run twice) or
//! `refresh` (declared safe to re-run) with a key of its own. Once the call
//! is journaled, the round SIGKILLs either the client (the next round's
//! process recovers the call) or the instance serving it (the client sends
//! the call again, with its key, through the balancer to the other
//! instance; the killed one is started again), at a random moment of the
//! call. Afterwards, for every round:
//!
//! - the tool ran at most once, or twice only for `refresh` whose instance
//!   was killed;
//! - the client learned the call's outcome: its answer, or "outcome
//!   unknown" (`-32041`) for a `charge` cut by the kill of its instance;
//!   never nothing (no call silently dropped);
//! - every answer the client got for a call is the same answer.
//!
//! `MCP_PERSIST_KILL_ROUNDS` sets the rounds (200 by default) and
//! `MCP_PERSIST_KILL_SEED` the seed of the random choices (printed on
//! every run).

use crate::support;

use std::{collections::HashMap, path::Path, time::Duration};

use crate::support::{Balancer, Instance, JsonChild};
use anyhow::Context as _;
use mcp_persist_core::{InFlightRequest, Stores};
use mcp_persist_transport_http::{
    client::{DurableClientBuilder, Recovery},
    exactly_once::{IDEMPOTENCY_KEY, OUTCOME_UNKNOWN},
};
use rmcp::{model::CallToolRequestParams, service::ServiceError};
use serde_json::{Value, json};

const TAG: &str = "MCP_PERSIST_ROUND_TAG";

fn tag_of(request: &InFlightRequest) -> String {
    request
        .params
        .as_ref()
        .and_then(|p| p["arguments"]["tag"].as_str())
        .unwrap_or("?")
        .to_owned()
}

fn text_of(result: &impl serde::Serialize) -> String {
    serde_json::to_value(result).unwrap_or_default()["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// One round's client process: recovers what earlier rounds left, then
/// (unless its tag is empty) makes its call, says `sent` once the call is
/// journaled, and reports the outcome. One JSON line per fact.
#[test]
fn round_client() {
    let Ok(tag) = std::env::var(TAG) else {
        return;
    };
    let var = |name: &str| std::env::var(name).expect(name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store =
            mcp_persist_store_sqlite::SqliteStore::open(format!("{}/client.db", var("DIR")))
                .await
                .expect("open");
        let stores = Stores::new(store);
        let (transport, handle) = DurableClientBuilder::new(var("URL"), &stores)
            .build()
            .await
            .expect("build");
        let client = rmcp::service::ClientServiceExt::serve_with_lifecycle(
            (),
            transport,
            rmcp::service::ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("serve");
        let say = |v: Value| println!("{v}");
        for recovery in handle.recover() {
            match recovery {
                Recovery::Reissue(call) => {
                    let tag = tag_of(call.request());
                    match call.send_with(client.peer()).await {
                        Ok(Ok(result)) => say(json!({"tag": tag, "answer": text_of(&result)})),
                        Ok(Err(error)) => say(json!({"tag": tag, "code": error.code.0})),
                        Err(e) => say(json!({"tag": tag, "recovery_error": e.to_string()})),
                    }
                }
                Recovery::Lost {
                    request, reason, ..
                } => {
                    say(json!({"tag": tag_of(&request), "lost": format!("{reason:?}")}));
                    handle.dismiss(&request);
                }
                other => say(json!({"other": format!("{other:?}")})),
            }
        }
        if !tag.is_empty() {
            let params: CallToolRequestParams = serde_json::from_value(json!({
                "name": var("TOOL"),
                "arguments": {"tag": tag, "delay_ms": var("DELAY").parse::<u64>().expect("delay")},
                "_meta": {IDEMPOTENCY_KEY: format!("key-{tag}")},
            }))
            .expect("params");
            let peer = client.peer().clone();
            let first = tokio::spawn({
                let (peer, params) = (peer.clone(), params.clone());
                async move { peer.call_tool(params).await }
            });
            // Past the journal's window, then committed: from here a
            // crash of this process leaves the call for the next one.
            tokio::time::sleep(Duration::from_millis(20)).await;
            handle.flush().await;
            say(json!({"sent": tag}));
            let mut outcome = first.await.expect("the call's task");
            // A broken connection (the instance was killed) loses the
            // request in this era: send it again, with the same key.
            for _ in 0..20 {
                match outcome {
                    Err(ServiceError::McpError(_)) | Ok(_) => break,
                    Err(other) => {
                        say(json!({"tag": tag, "retry": other.to_string()}));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        outcome = peer.call_tool(params.clone()).await;
                    }
                }
            }
            match outcome {
                Ok(result) => say(json!({"tag": tag, "answer": text_of(&result)})),
                Err(ServiceError::McpError(error)) => {
                    say(json!({"tag": tag, "code": error.code.0}))
                }
                Err(other) => say(json!({"tag": tag, "gave_up": other.to_string()})),
            }
        }
        handle.flush().await;
        say(json!({"done": true}));
    });
}

/// A small deterministic generator (xorshift64*), seeded per run.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Victim {
    Client,
    Server,
}

/// What the client learned of each call, by tag.
#[derive(Default)]
struct Learned {
    answers: HashMap<String, Vec<String>>,
    unknown: HashMap<String, usize>,
    other: Vec<Value>,
}

impl Learned {
    /// Takes in one line of a client process.
    fn take(&mut self, line: &Value) {
        let Some(tag) = line["tag"].as_str() else {
            if line.get("done").is_none() && line.get("sent").is_none() {
                self.other.push(line.clone());
            }
            return;
        };
        if let Some(answer) = line["answer"].as_str() {
            self.answers
                .entry(tag.to_owned())
                .or_default()
                .push(answer.to_owned());
        } else if line["code"] == i64::from(OUTCOME_UNKNOWN.0) {
            *self.unknown.entry(tag.to_owned()).or_default() += 1;
        } else if line.get("retry").is_none() {
            self.other.push(line.clone());
        }
    }

    /// Reads a child's lines up to `done` (or its end, when it was killed).
    async fn drain(&mut self, child: &mut JsonChild) -> anyhow::Result<()> {
        while let Ok(line) = child.json().await {
            self.take(&line);
            if line.get("done").is_some() {
                break;
            }
        }
        Ok(())
    }
}

fn runs(file: &Path, line: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_kills_of_either_side_never_run_a_call_twice_nor_drop_one() -> anyhow::Result<()> {
    let rounds: usize = std::env::var("MCP_PERSIST_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("MCP_PERSIST_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    println!("{rounds} rounds, MCP_PERSIST_KILL_SEED={seed}");
    let mut dice = Dice(seed);
    let dir = tempfile::tempdir()?;
    let dir_path = dir.path().to_str().context("utf-8")?.to_owned();
    let file = dir.path().join("runs");
    let db = dir.path().join("state.db");
    let args = [
        "--backend",
        "sqlite",
        "--store",
        db.to_str().context("utf-8")?,
        "--liveness-grace-ms",
        "600",
        "--runs-file",
        file.to_str().context("utf-8")?,
    ];
    let mut instances = [
        Instance::process(&args).await?,
        Instance::process(&args).await?,
    ];
    let mut live = 0;
    let balancer = Balancer::new(instances[live].addr()).await?;
    let url = balancer.url();

    let mut learned = Learned::default();
    let mut plan = Vec::new();
    for round in 0..rounds {
        let tag = format!("r{round}");
        let tool = if dice.below(3) == 0 {
            "refresh"
        } else {
            "charge"
        };
        let delay = 40 + dice.below(300);
        let victim = if dice.below(2) == 0 {
            Victim::Client
        } else {
            Victim::Server
        };
        let at = dice.below(delay + 120);
        plan.push((tag.clone(), tool, victim));
        let delay = delay.to_string();
        let mut child = JsonChild::spawn(
            &support::test_path(module_path!(), "round_client"),
            &[
                (TAG, &tag),
                ("TOOL", tool),
                ("DELAY", &delay),
                ("URL", &url),
                ("DIR", &dir_path),
            ],
        )?;
        loop {
            let line = child
                .json()
                .await
                .with_context(|| format!("round {round} (seed {seed})"))?;
            if line.get("sent").is_some() {
                break;
            }
            learned.take(&line);
        }
        tokio::time::sleep(Duration::from_millis(at)).await;
        match victim {
            Victim::Client => {
                // What it said before dying still counts.
                child.kill().await?;
                learned.drain(&mut child).await?;
            }
            Victim::Server => {
                let dead = live;
                instances[dead].kill().await?;
                live = 1 - live;
                balancer.switch(instances[live].addr());
                learned.drain(&mut child).await?;
                child.child.wait().await?;
                instances[dead] = Instance::process(&args).await?;
            }
        }
    }
    // The last round's call, if its client was killed.
    let mut last = JsonChild::spawn(
        &support::test_path(module_path!(), "round_client"),
        &[(TAG, ""), ("URL", &url), ("DIR", &dir_path)],
    )?;
    learned.drain(&mut last).await?;

    assert!(
        learned.other.is_empty(),
        "unexpected client reports (seed {seed}): {:?}",
        learned.other
    );
    let (mut answered, mut unknown, mut reran) = (0, 0, 0);
    for (tag, tool, victim) in &plan {
        let ran = runs(&file, &format!("{tool} {tag}"));
        let answers = learned.answers.get(tag).cloned().unwrap_or_default();
        let unknowns = learned.unknown.get(tag).copied().unwrap_or(0);
        let context = format!(
            "{tool} {tag}, {victim:?} killed, ran {ran} time(s), answers {answers:?}, \
             {unknowns} outcome-unknown (seed {seed})"
        );
        assert!(
            !answers.is_empty() || unknowns > 0,
            "the call was dropped without a word: {context}"
        );
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "different answers: {context}"
        );
        if let Some(answer) = answers.first() {
            assert!(
                answer.starts_with(&format!("{tool} {tag}: run ")),
                "{context}"
            );
            assert!(ran >= 1, "answered without running: {context}");
            answered += 1;
        } else {
            unknown += 1;
            assert_eq!(
                *tool, "charge",
                "a re-runnable call was left unknown: {context}"
            );
            assert_eq!(*victim, Victim::Server, "{context}");
        }
        match (*tool, ran) {
            (_, 0 | 1) => {}
            ("refresh", 2) if *victim == Victim::Server => reran += 1,
            _ => panic!("the tool ran too often: {context}"),
        }
    }
    println!(
        "{rounds} rounds ({} client kills, {} server kills): {answered} answered, \
         {unknown} outcome unknown, {reran} re-runnable calls run again",
        plan.iter().filter(|p| p.2 == Victim::Client).count(),
        plan.iter().filter(|p| p.2 == Victim::Server).count(),
    );
    Ok(())
}
