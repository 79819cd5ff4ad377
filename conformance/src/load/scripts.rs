//! What each simulated client does, and how it checks what it got.
//!
//! * A **legacy session** (2025-11-25) initializes on one instance, sends
//!   its first request to another (the session is restored from the store
//!   there), calls `slow_progress` with a progress token and hangs up after
//!   a few progress notifications, resumes with `Last-Event-ID` on a third
//!   instance until the response, then replays the finished call from its
//!   first progress notification on yet another instance. Every progress
//!   number must arrive exactly once; the replay must return exactly the
//!   events first received after that id, with their ids.
//! * A **task client** (2026-07-28) starts `long_job` as a task on one
//!   instance and polls `tasks/get` round the fleet until it completes.
//! * The **bus**: one `subscriptions/listen` stream per instance, and a
//!   publisher announcing resource updates round the fleet; every listener
//!   connected throughout must hear each announcement exactly once.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    fleet::Fleet,
    stats::{BUS, REPLAY, RESTORE, RESUME, Stats, TASKS_GET},
    wire::{
        Event, Failure, Sse, Wire, ensure, legacy_headers, modern_headers, modern_request, result,
    },
};

/// Counter names.
pub const EVENTS: &str = "events delivered";
/// Events a replay of a finished call delivered.
pub const REPLAYED: &str = "events replayed";
/// Events a client never got although the server stored or announced them.
pub const LOST: &str = "lost events";
/// Events a client got twice, or from another stream.
pub const DUPLICATED: &str = "duplicated events";
/// Calls answered with their result.
pub const CALLS_DONE: &str = "calls answered";
/// Calls ended by the fleet because their instance died.
pub const CALLS_ORPHANED: &str = "calls orphaned by the kill";
/// Tasks completed.
pub const TASKS_DONE: &str = "tasks completed";
/// Sessions created.
pub const SESSIONS: &str = "legacy sessions";
/// Notices heard by listeners.
pub const NOTICES: &str = "bus notices heard";

/// What every script needs.
#[derive(Clone)]
pub struct Ctx {
    /// The fleet.
    pub fleet: Arc<Fleet>,
    /// The HTTP client.
    pub wire: Wire,
    /// Where figures go.
    pub stats: Arc<Stats>,
}

impl Ctx {
    /// Runs `attempt` on instance `first`, then on the next ones while the
    /// connection fails (an instance is down): the answer and the instance
    /// that gave it.
    async fn on_any<T, F, Fut>(&self, first: usize, mut attempt: F) -> Result<(T, usize), Failure>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut last = None;
        for i in 0..self.fleet.len() * 2 {
            let at = (first + i) % self.fleet.len();
            match attempt(self.fleet.url(at)).await {
                Ok(v) => return Ok((v, at)),
                Err(e @ Failure::Connect(_)) => {
                    self.stats.error(e.kind());
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Failure::Timeout))
    }
}

/// The events of one call, as received across connections.
#[derive(Default)]
struct CallLog {
    /// Message events in the order received: (id, message).
    events: Vec<(String, Value)>,
    ids: HashSet<String>,
    progress: HashMap<u64, u32>,
    last_id: Option<String>,
    answer: Option<Value>,
    duplicated: u64,
}

impl CallLog {
    fn take(&mut self, event: Event, request: u64) {
        if let Some(id) = &event.id {
            self.last_id = Some(id.clone());
        }
        let Some(message) = event.message else {
            return; // a priming event
        };
        let id = event.id.unwrap_or_default();
        if !self.ids.insert(id.clone()) {
            self.duplicated += 1;
            return;
        }
        if message["method"] == "notifications/progress" {
            let n = message["params"]["progress"].as_f64().unwrap_or(-1.0) as u64;
            let seen = self.progress.entry(n).or_default();
            *seen += 1;
            if *seen > 1 {
                self.duplicated += 1;
            }
        } else if message["id"] == request {
            self.answer = Some(message.clone());
        }
        self.events.push((id, message));
    }

    fn progress_seen(&self) -> usize {
        self.progress.len()
    }

    fn orphaned(&self) -> bool {
        self.answer
            .as_ref()
            .is_some_and(|a| a["error"]["data"]["reason"] == "orphaned")
    }
}

/// Reads `sse` into `log` until the answer, the end of the stream, or
/// `stop_after` progress notifications. `Ok(true)` when the stream broke
/// (the instance went away) rather than ended.
async fn read_call(
    sse: &mut Sse,
    log: &mut CallLog,
    request: u64,
    stop_after: Option<usize>,
    wait: Duration,
    mut first_message: impl FnMut(),
) -> Result<bool, Failure> {
    let mut first = true;
    loop {
        match sse.next(wait).await {
            Ok(Some(event)) => {
                if first && event.message.is_some() {
                    first = false;
                    first_message();
                }
                log.take(event, request);
                if log.answer.is_some() || stop_after.is_some_and(|n| log.progress_seen() >= n) {
                    return Ok(false);
                }
            }
            Ok(None) => return Ok(false),
            Err(Failure::Connect(_)) => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}

/// One legacy session (see the module docs). `n` picks its instances,
/// principal and call length.
pub async fn legacy(ctx: &Ctx, n: usize) -> Result<(), Failure> {
    let m = ctx.fleet.len();
    let user = format!("user-{}", n % 97);
    let (session, home) = ctx
        .on_any(n % m, |url| {
            let wire = ctx.wire.clone();
            let user = user.clone();
            async move { wire.initialize(&url, &user).await }
        })
        .await?;
    ctx.stats.count(SESSIONS, 1);
    let headers = legacy_headers(&user, &session);

    // The first request on another instance restores the session there.
    let started = Instant::now();
    let ping = json!({ "jsonrpc": "2.0", "id": 1, "method": "ping" });
    let (_, there) = ctx
        .on_any(home + 1, |url| {
            let wire = ctx.wire.clone();
            let ping = ping.clone();
            async move { wire.rpc(&url, &headers, &ping).await }
        })
        .await?;
    ctx.stats.sample(RESTORE, started.elapsed());

    // A call with progress, hung up on after `cut` notifications.
    let count = 3 + (n % 6) as u64;
    let cut = 1 + n % (count as usize - 1);
    let request = 2u64;
    let call = json!({
        "jsonrpc": "2.0", "id": request, "method": "tools/call",
        "params": {
            "name": "slow_progress",
            "arguments": { "count": count, "delay_ms": 20, "tag": format!("s{n}") },
            "_meta": { "progressToken": format!("p{n}") }
        }
    });
    let (answer, at) = ctx
        .on_any(there, |url| {
            let wire = ctx.wire.clone();
            let call = call.clone();
            async move { wire.post(&url, &headers, &call).await }
        })
        .await?;
    let mut sse = match answer {
        super::wire::Answer::Stream(sse) => sse,
        _ => {
            return Err(Failure::Protocol(
                "tools/call was not answered with SSE".into(),
            ));
        }
    };
    let mut log = CallLog::default();
    let wait = ctx.wire.timeout();
    read_call(&mut sse, &mut log, request, Some(cut), wait, || {}).await?;
    drop(sse);

    // Resume on another instance until the answer.
    let mut target = at + 1;
    let mut gone = false;
    for _ in 0..8 {
        if log.answer.is_some() {
            break;
        }
        let Some(last) = log.last_id.clone() else {
            return Err(Failure::Protocol(
                "the call's stream sent no event id".into(),
            ));
        };
        let url = ctx.fleet.url(target);
        let asked = Instant::now();
        match ctx.wire.resume(&url, &user, &session, &last).await {
            Ok(mut sse) => {
                let stats = ctx.stats.clone();
                let broke = read_call(&mut sse, &mut log, request, None, wait, || {
                    stats.sample(RESUME, asked.elapsed());
                })
                .await?;
                if broke {
                    ctx.stats.error("connection failed");
                    target += 1;
                }
            }
            Err(e @ Failure::Connect(_)) => {
                ctx.stats.error(e.kind());
                target += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(Failure::Status(410, body)) => {
                ctx.stats.error(format!(
                    "410 on resume: {}",
                    body.chars().take(60).collect::<String>()
                ));
                gone = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    ctx.stats.count(EVENTS, log.events.len() as u64);
    ctx.stats.count(DUPLICATED, log.duplicated);
    let distinct = log.progress.len() as u64;
    if log.orphaned() {
        // The instance running the call died: what it stored came, then the
        // fleet's error. Nothing may be missing below the last one heard.
        let highest = log.progress.keys().max().copied().unwrap_or(0);
        ctx.stats.count(LOST, highest.saturating_sub(distinct));
        ctx.stats.count(CALLS_ORPHANED, 1);
        return Ok(());
    }
    match &log.answer {
        Some(answer) if answer.get("result").is_some() => {
            ctx.stats.count(LOST, count.saturating_sub(distinct));
            ctx.stats.count(CALLS_DONE, 1);
        }
        Some(answer) => {
            return Err(Failure::Protocol(format!("the call failed: {answer}")));
        }
        None if gone => {
            ctx.stats.count(LOST, count.saturating_sub(distinct) + 1);
            return Ok(());
        }
        None => return Err(Failure::Protocol("the call never answered".into())),
    }

    // The finished call, replayed from its first progress notification on
    // yet another instance: exactly what came after it, with the same ids.
    let Some(from) = log
        .events
        .iter()
        .position(|(_, m)| m["method"] == "notifications/progress")
    else {
        return Ok(());
    };
    let expected = &log.events[from + 1..];
    let from_id = log.events[from].0.clone();
    // A replay cut by an instance going away (the SIGKILL of the run) is
    // asked again of the next instance, as a client would; what counts is
    // the first replay that ran to its end.
    let mut again = CallLog::default();
    let mut target = at + 2;
    for _ in 0..4 {
        let asked = Instant::now();
        let (mut sse, there) = ctx
            .on_any(target, |url| {
                let wire = ctx.wire.clone();
                let (user, session, from_id) = (user.clone(), session.clone(), from_id.clone());
                async move { wire.resume(&url, &user, &session, &from_id).await }
            })
            .await?;
        again = CallLog::default();
        if read_call(&mut sse, &mut again, request, None, wait, || {}).await? {
            ctx.stats.error("replay cut by a connection failure");
            target = there + 1;
            continue;
        }
        if again.answer.is_some() {
            ctx.stats.sample(REPLAY, asked.elapsed());
        }
        break;
    }
    ctx.stats.count(REPLAYED, again.events.len() as u64);
    let want: Vec<&String> = expected.iter().map(|(id, _)| id).collect();
    let got: Vec<&String> = again.events.iter().map(|(id, _)| id).collect();
    if want != got || expected.iter().zip(&again.events).any(|(a, b)| a.1 != b.1) {
        let wanted: HashSet<&String> = want.iter().copied().collect();
        let missing = want.iter().filter(|id| !got.contains(id)).count() as u64;
        let extra = got.iter().filter(|id| !wanted.contains(*id)).count() as u64;
        ctx.stats.count(LOST, missing);
        ctx.stats.count(DUPLICATED, extra + again.duplicated);
        ctx.stats.error("replay differs from the original events");
    }
    Ok(())
}

/// One task client (see the module docs).
pub async fn task(ctx: &Ctx, n: usize) -> Result<(), Failure> {
    let m = ctx.fleet.len();
    let user = format!("user-{}", n % 97);
    let tag = format!("t{n}");
    let body = modern_request(
        1,
        "tools/call",
        json!({ "name": "long_job", "arguments": { "steps": 2, "step_ms": 100, "tag": tag } }),
    );
    let (created, at) = ctx
        .on_any(n % m, |url| {
            let wire = ctx.wire.clone();
            let (user, body) = (user.clone(), body.clone());
            async move {
                wire.rpc(
                    &url,
                    &modern_headers(&user, "tools/call", Some("long_job")),
                    &body,
                )
                .await
            }
        })
        .await?;
    let created = result(&created)?;
    ensure(created["resultType"] == "task", || {
        format!("not a task: {created}")
    })?;
    let task = created["taskId"]
        .as_str()
        .ok_or_else(|| Failure::Protocol("no taskId".into()))?
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = at + 1;
    let mut id = 2;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if Instant::now() > deadline {
            return Err(Failure::Protocol(
                "the task did not finish within 60 s".into(),
            ));
        }
        let get = modern_request(id, "tasks/get", json!({ "taskId": task }));
        id += 1;
        let asked = Instant::now();
        let url = ctx.fleet.url(i);
        i += 1;
        let answer = match ctx
            .wire
            .rpc(&url, &modern_headers(&user, "tasks/get", Some(&task)), &get)
            .await
        {
            Ok(answer) => answer,
            Err(e @ Failure::Connect(_)) => {
                ctx.stats.error(e.kind());
                continue;
            }
            Err(e) => return Err(e),
        };
        ctx.stats.sample(TASKS_GET, asked.elapsed());
        let status = result(&answer)?;
        match status["status"].as_str() {
            Some("completed") => {
                let text = status["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default();
                ensure(text.contains(&format!("job {tag} done")), || {
                    format!("the task answered {status}")
                })?;
                ctx.stats.count(TASKS_DONE, 1);
                return Ok(());
            }
            Some("failed" | "cancelled") => {
                return Err(Failure::Protocol(format!("the task ended {status}")));
            }
            _ => {}
        }
    }
}

/// How many distinct notices a run announces at most.
pub const MAX_NOTICES: usize = 1200;
/// How long a notice may take to reach a listener before it counts as lost.
pub const BUS_GRACE: Duration = Duration::from_secs(5);

fn notice_uri(j: usize) -> String {
    format!("load://bus/{j}")
}

/// One listener's history: when it was connected, what it heard when.
#[derive(Default)]
pub struct Listener {
    connected: Mutex<Vec<(Instant, Option<Instant>)>>,
    heard: Mutex<HashMap<usize, Vec<Instant>>>,
}

impl Listener {
    /// Listens on instance `index` for ever, reconnecting when its stream
    /// ends (abort the task to stop it).
    pub async fn run(self: Arc<Self>, ctx: Ctx, index: usize) {
        let uris: Vec<String> = (0..MAX_NOTICES).map(notice_uri).collect();
        let body = modern_request(
            1,
            "subscriptions/listen",
            json!({ "notifications": { "resourceSubscriptions": uris } }),
        );
        loop {
            let url = ctx.fleet.url(index);
            let headers = modern_headers("bus", "subscriptions/listen", None);
            let mut sse = match ctx.wire.post(&url, &headers, &body).await {
                Ok(super::wire::Answer::Stream(sse)) => sse,
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut acknowledged = false;
            loop {
                match sse.next(Duration::from_secs(3600)).await {
                    Ok(Some(Event {
                        message: Some(m), ..
                    })) => {
                        let now = Instant::now();
                        if m["method"] == "notifications/subscriptions/acknowledged" {
                            acknowledged = true;
                            self.lock_connected().push((now, None));
                        } else if m["method"] == "notifications/resources/updated"
                            && let Some(j) = m["params"]["uri"]
                                .as_str()
                                .and_then(|u| u.strip_prefix("load://bus/"))
                                .and_then(|j| j.parse::<usize>().ok())
                        {
                            ctx.stats.count(NOTICES, 1);
                            self.heard
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .entry(j)
                                .or_default()
                                .push(now);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            if acknowledged {
                self.close(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn lock_connected(&self) -> std::sync::MutexGuard<'_, Vec<(Instant, Option<Instant>)>> {
        self.connected.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the open connection, if any, as ended at `at`.
    pub fn close(&self, at: Instant) {
        if let Some(last) = self.lock_connected().last_mut()
            && last.1.is_none()
        {
            last.1 = Some(at);
        }
    }

    /// Whether it was connected from before `from` until `until`.
    fn covered(&self, from: Instant, until: Instant) -> bool {
        self.lock_connected()
            .iter()
            .any(|(a, b)| *a <= from && b.is_none_or(|b| b >= until))
    }
}

/// One announcement: its number, when it was sent, whether it was accepted.
pub struct Notice {
    j: usize,
    at: Instant,
    ok: bool,
}

/// Announces a resource update every `every` round the fleet until `stop`
/// is set; what it announced.
pub async fn publish(
    ctx: Ctx,
    every: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<Notice> {
    let mut notices = Vec::new();
    for j in 0..MAX_NOTICES {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let at = Instant::now();
        let body = modern_request(
            1,
            "tools/call",
            json!({ "name": "touch_resource", "arguments": { "uri": notice_uri(j) } }),
        );
        let outcome = ctx
            .on_any(j, |url| {
                let wire = ctx.wire.clone();
                let body = body.clone();
                async move {
                    wire.rpc(
                        &url,
                        &modern_headers("bus", "tools/call", Some("touch_resource")),
                        &body,
                    )
                    .await
                }
            })
            .await;
        let ok = match outcome {
            Ok((answer, _)) => answer.to_string().contains("published"),
            Err(e) => {
                ctx.stats.error(format!("bus publish: {}", e.kind()));
                false
            }
        };
        notices.push(Notice { j, at, ok });
        tokio::time::sleep(every.saturating_sub(at.elapsed())).await;
    }
    notices
}

/// Checks what every listener heard against what was announced: counts
/// lost and duplicated notices and samples delivery latencies.
pub fn account(ctx: &Ctx, notices: &[Notice], listeners: &[Arc<Listener>]) {
    for listener in listeners {
        let heard = listener.heard.lock().unwrap_or_else(|p| p.into_inner());
        for notice in notices {
            let times = heard.get(&notice.j).map_or(&[][..], Vec::as_slice);
            if times.len() > 1 {
                ctx.stats.count(DUPLICATED, times.len() as u64 - 1);
            }
            let expected = notice.ok && listener.covered(notice.at, notice.at + BUS_GRACE);
            match times.first() {
                Some(first) if expected => ctx.stats.sample(BUS, first.duration_since(notice.at)),
                None if expected => {
                    ctx.stats.count(LOST, 1);
                    ctx.stats.error("bus notice not heard");
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, message: Option<Value>) -> Event {
        Event {
            id: Some(id.to_owned()),
            message,
        }
    }

    fn progress(n: u64) -> Option<Value> {
        Some(
            json!({ "jsonrpc": "2.0", "method": "notifications/progress",
                     "params": { "progressToken": "p", "progress": n } }),
        )
    }

    #[test]
    fn a_call_log_counts_an_event_heard_twice_as_duplicated() {
        let mut log = CallLog::default();
        log.take(event("t-0", None), 2);
        log.take(event("t-1", progress(1)), 2);
        log.take(event("t-2", progress(2)), 2);
        assert_eq!((log.duplicated, log.progress_seen()), (0, 2));
        // The same event again (a replay that went back too far)...
        log.take(event("t-2", progress(2)), 2);
        assert_eq!(log.duplicated, 1);
        // ... or the same notification under another id (sent twice).
        log.take(event("u-3", progress(1)), 2);
        assert_eq!(log.duplicated, 2);
        assert_eq!(log.last_id.as_deref(), Some("u-3"));
        log.take(
            event(
                "t-3",
                Some(json!({ "jsonrpc": "2.0", "id": 2, "result": {} })),
            ),
            2,
        );
        assert!(log.answer.is_some());
        assert_eq!(log.events.len(), 4);
    }
}
