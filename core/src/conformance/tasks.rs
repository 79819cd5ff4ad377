//! Durable tasks, instance leases and the fleet notification bus on a
//! backend: what the task runtime and the bus rely on.

use std::{sync::Arc, time::Duration};

use super::{KvFixture, LogFixture};
use crate::{
    Error, InstanceLeases, Liveness, PutMode, PutOptions, TaskId, TaskOwner, TaskRecord,
    TaskStatus, TaskStore, TaskUpdate, Timestamp,
};

fn store(f_kv: Arc<dyn crate::KvStore>, f_log: Arc<dyn crate::LogStore>) -> TaskStore {
    TaskStore::new(f_kv, f_log)
}

fn task(principal: &str) -> TaskRecord {
    TaskRecord::new(
        TaskId::generate().expect("random"),
        Some(principal.to_owned()),
        TaskOwner::new("instance-a", 1, Timestamp::now()),
    )
    .with_ttl_ms(Some(600_000))
    .with_poll_interval_ms(Some(100))
}

/// A created task is readable by a store opened afresh (another instance)
/// as soon as `create` returns, and a second create of the id is refused.
pub async fn task_create_is_visible_before_return(f: &dyn LogFixture) {
    let tasks = store(f.open_kv().await, f.open_log().await);
    let record = task("alice");
    tasks.create(&record).await.expect("create");
    let other = store(f.open_kv().await, f.open_log().await);
    let loaded = other
        .load(&record.task_id)
        .await
        .expect("load")
        .expect("the task is there once create returned");
    assert_eq!(loaded.record, record);
    assert!(matches!(
        other.create(&record).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert!(
        other
            .load(&TaskId::new("never-created").expect("id"))
            .await
            .expect("load")
            .is_none()
    );
}

/// Every transition is a compare-and-swap: 8 writers adding 10 input keys
/// each to one task lose none of them.
pub async fn task_transitions_are_compare_and_swap(f: &dyn LogFixture) {
    let record = task("alice");
    let id = record.task_id.clone();
    store(f.open_kv().await, f.open_log().await)
        .create(&record)
        .await
        .expect("create");
    let mut writers = Vec::new();
    for w in 0..8 {
        let tasks = store(f.open_kv().await, f.open_log().await);
        let id = id.clone();
        writers.push(tokio::spawn(async move {
            for n in 0..10 {
                let key = format!("w{w}-{n}");
                let outcome = tasks
                    .update(&id, |t| {
                        t.used_input_keys.insert(key.clone());
                        t.input_requests
                            .insert(key.clone(), serde_json::json!({"n": n}));
                        Ok(true)
                    })
                    .await
                    .expect("update");
                assert!(matches!(outcome, TaskUpdate::Updated(_)), "{outcome:?}");
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    let tasks = store(f.open_kv().await, f.open_log().await);
    let stored = tasks.load(&id).await.expect("load").expect("task");
    assert_eq!(stored.record.used_input_keys.len(), 80);
    assert_eq!(stored.record.input_requests.len(), 80);
    assert_eq!(stored.record.status, TaskStatus::InputRequired);
}

/// A task that ended never changes again: later updates are not applied
/// and say so.
pub async fn task_terminal_state_never_changes(f: &dyn LogFixture) {
    let tasks = store(f.open_kv().await, f.open_log().await);
    let record = task("alice");
    let id = record.task_id.clone();
    tasks.create(&record).await.expect("create");
    let done = tasks
        .update(&id, |t| {
            t.complete(serde_json::json!({"content": [{"type": "text", "text": "42"}]}));
            Ok(true)
        })
        .await
        .expect("complete");
    assert!(matches!(done, TaskUpdate::Updated(_)));
    for attempt in 0..3 {
        let mut called = false;
        let outcome = tasks
            .update(&id, |t| {
                called = true;
                t.fail(serde_json::json!({"code": -32603, "message": "late"}));
                Ok(true)
            })
            .await
            .expect("update");
        assert!(!called, "attempt {attempt}: closure ran on a terminal task");
        let TaskUpdate::Terminal(stored) = outcome else {
            panic!("expected Terminal, got {outcome:?}");
        };
        assert_eq!(stored.record.status, TaskStatus::Completed);
    }
    let reread = store(f.open_kv().await, f.open_log().await)
        .load(&id)
        .await
        .expect("load")
        .expect("task");
    assert_eq!(reread.record.status, TaskStatus::Completed);
    assert!(reread.record.error.is_none());
}

/// A task still running when its TTL runs out reads as `failed` with an
/// error saying so; the record is deleted one more TTL later.
pub async fn task_ttl_fails_then_deletes(f: &dyn LogFixture) {
    let tasks = store(f.open_kv().await, f.open_log().await);
    // Polled, not slept through: a slow backend (an emulator on two busy
    // cores) is judged by when things happen, and a TTL of a second leaves
    // it time to be seen between the two deadlines.
    const TTL: Duration = Duration::from_secs(1);
    const PATIENCE: Duration = Duration::from_secs(10);
    let poll = Duration::from_millis(20);
    // Taken before the record is made: its own creation time is later.
    let started = std::time::Instant::now();
    let record = task("alice").with_ttl_ms(Some(1000));
    let id = record.task_id.clone();
    tasks.create(&record).await.expect("create");
    let expired = loop {
        let loaded = tasks
            .load(&id)
            .await
            .expect("load")
            .expect("retained until created + 2 x TTL");
        if loaded.record.status == TaskStatus::Failed {
            break loaded;
        }
        assert_eq!(loaded.record.status, TaskStatus::Working);
        assert!(
            started.elapsed() < PATIENCE,
            "still working after {PATIENCE:?}"
        );
        tokio::time::sleep(poll).await;
    };
    // Judged by the record's own clock: `created_at` is in whole
    // milliseconds, so it can read up to one earlier than `started`.
    let created = record.created_at;
    assert!(
        Timestamp::now() >= created.plus(TTL),
        "failed before its TTL ran out"
    );
    let message = expired.record.error.as_ref().expect("error")["message"]
        .as_str()
        .expect("message")
        .to_owned();
    assert!(message.contains("TTL"), "{message}");
    // Retained until created + 2 x TTL, then gone for good.
    while tasks.load(&id).await.expect("load").is_some() {
        assert!(
            started.elapsed() < PATIENCE,
            "still retained after {PATIENCE:?}"
        );
        tokio::time::sleep(poll).await;
    }
    assert!(
        Timestamp::now() >= created.plus(TTL * 2),
        "deleted before created + 2 x TTL"
    );
}

/// A task record written by a newer schema is a typed error, and nothing
/// overwrites it.
pub async fn task_newer_schema_is_typed_error(f: &dyn LogFixture) {
    let kv = f.open_kv().await;
    let tasks = store(kv.clone(), f.open_log().await);
    let id = TaskId::new("from-the-future").expect("id");
    let key = &crate::declare::TASK.key(&["from-the-future"]);
    let bytes = br#"{"kind":"task","schema":99,"record":{"whatever":true}}"#.to_vec();
    kv.put(key, bytes.clone(), PutOptions::new(PutMode::Create))
        .await
        .expect("put");
    assert!(matches!(
        tasks.load(&id).await,
        Err(Error::NewerSchema { found: 99, .. })
    ));
    assert!(matches!(
        tasks.update(&id, |_| Ok(true)).await,
        Err(Error::NewerSchema { .. })
    ));
    assert_eq!(kv.get(key).await.expect("get").expect("kept").value, bytes);
}

/// The inbox wakes a waiter on another store handle.
pub async fn task_inbox_wakes_the_owner(f: &dyn LogFixture) {
    let tasks = store(f.open_kv().await, f.open_log().await);
    let record = task("alice");
    let id = record.task_id.clone();
    tasks.create(&record).await.expect("create");
    let start = tasks.inbox_position(&id).await.expect("position");
    let waiter = {
        let tasks = store(f.open_kv().await, f.open_log().await);
        let id = id.clone();
        tokio::spawn(async move { tasks.wait_ring(&id, start, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rung = tasks.ring(&id, "input").await.expect("ring");
    let seen = waiter.await.expect("join").expect("wait");
    assert_eq!(seen, rung);
    assert!(seen > start);
}

/// An instance lease: alive while renewed, dead once not renewed for the
/// grace period (on the observer's clock), or at once when released.
pub async fn instance_lease_liveness(f: &dyn KvFixture) {
    let grace = Duration::from_millis(300);
    let leases = InstanceLeases::new(f.open_kv().await, grace);
    let observer = InstanceLeases::new(f.open_kv().await, grace);
    let mut mine = leases.register().await.expect("register");
    assert_eq!(
        observer.observe(mine.id()).await.expect("observe"),
        Liveness::Alive
    );
    for _ in 0..5 {
        tokio::time::sleep(grace / 3).await;
        assert!(leases.renew(&mut mine).await.expect("renew"));
        assert_eq!(
            observer.observe(mine.id()).await.expect("observe"),
            Liveness::Alive,
            "a renewed lease is alive"
        );
    }
    tokio::time::sleep(grace + Duration::from_millis(50)).await;
    assert_eq!(
        observer.observe(mine.id()).await.expect("observe"),
        Liveness::Dead,
        "not renewed for the grace period"
    );
    // Declared dead, it learns so at its next renewal and registers again.
    assert!(!leases.renew(&mut mine).await.expect("renew"));
    assert_eq!(
        observer.observe(mine.id()).await.expect("observe"),
        Liveness::Alive
    );
    leases.release(&mine).await.expect("release");
    assert_eq!(
        observer.observe(mine.id()).await.expect("observe"),
        Liveness::Dead
    );
}

/// A notice published through one store handle reaches a waiter on another
/// in order; the bus keeps at most its length limit.
pub async fn bus_delivers_in_order_and_stays_bounded(f: &dyn LogFixture) {
    use crate::{BusRetention, FleetNotice, NotificationBus};
    let retention = BusRetention::new(100, Duration::from_secs(600));
    let publisher = NotificationBus::new(f.open_log().await, retention);
    let listener = NotificationBus::new(f.open_log().await, retention);
    let start = listener.head().await.expect("head");
    let waiter = tokio::spawn(async move {
        let mut after = start;
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let (last, messages) = listener
                .wait(after, Duration::from_secs(10))
                .await
                .expect("wait");
            assert!(!messages.is_empty() || last == after, "timed out");
            after = last;
            seen.extend(messages.into_iter().map(|(_, m)| m.notice));
        }
        seen
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let notices = [
        FleetNotice::ToolsListChanged,
        FleetNotice::ResourceUpdated {
            uri: "file:///a".into(),
        },
        FleetNotice::PromptsListChanged,
    ];
    for n in &notices {
        publisher
            .publish(n.clone(), Some("a"))
            .await
            .expect("publish");
    }
    assert_eq!(waiter.await.expect("join"), notices.to_vec());
    // An oversized notice is refused at publish, and the bus carries on.
    let head = publisher.head().await.expect("head");
    let huge = FleetNotice::ResourceUpdated {
        uri: format!("file:///{}", "x".repeat(crate::MAX_NOTICE_BYTES)),
    };
    match publisher.publish(huge, None).await {
        Err(crate::Error::TooLarge { what, limit, .. }) => {
            assert_eq!((what, limit), ("fleet notice", crate::MAX_NOTICE_BYTES));
        }
        other => panic!("an oversized notice was not refused: {other:?}"),
    }
    assert_eq!(
        publisher.head().await.expect("head"),
        head,
        "nothing published"
    );
    // 400 more: at most the length limit plus one trim interval remain.
    for _ in 0..400 {
        publisher
            .publish(FleetNotice::ToolsListChanged, None)
            .await
            .expect("publish");
    }
    let (_, kept) = publisher.wait(0, Duration::ZERO).await.expect("read");
    let mut count = kept.len() as u64;
    let mut after = kept.last().map_or(0, |(s, _)| *s);
    loop {
        let (last, more) = publisher.wait(after, Duration::ZERO).await.expect("read");
        if more.is_empty() {
            break;
        }
        count += more.len() as u64;
        after = last;
    }
    assert!(count <= 100 + 64, "{count} notices kept");
    assert!(count >= 100, "{count} notices kept");
}
