//! `cargo xtask`: the developer tasks of mcp-persist.
//!
//! * `cargo xtask test`: formatting, clippy, docs and every workspace test,
//!   with the services they need started first. The one test command; CI
//!   runs exactly this.
//! * `cargo xtask bench`: every benchmark, each against a baseline measured
//!   in the same run.
//! * `cargo xtask load`: a fleet of server processes on one store under a
//!   realistic mix of sessions, one of them SIGKILLed mid-run; prints what a
//!   session, a stream and an event cost in the store.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{Context, Result, bail};

mod conformance;
mod demo;
mod interop;
mod load;
mod moto;
mod postgres;
mod redis;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("demo") => demo::run(&args[1..]),
        Some("conformance") => conformance::run(&args[1..]),
        Some("interop") => interop::run(&args[1..]),
        Some("load") => load::run(&args[1..]),
        Some("features") => check_features(),
        Some("services") => services(),
        _ => {
            eprintln!(
                "usage: cargo xtask <command>\n\n\
                 commands:\n  \
                 test       fmt, clippy, docs and all tests, with services started (what CI runs)\n  \
                 bench      benchmarks against same-run baselines (optionally: names to run)\n  \
                 demo       a client and a server killed with SIGKILL and restarted, carrying on\n  \
                 conformance  the official MCP conformance suite against our client and server\n  \
                 interop    the TypeScript SDK client and the MCP Inspector CLI against two server instances\n  \
                 load       a fleet on one store under load: latencies and store bytes per session (--quick: the smoke test)\n  \
                 features   check that each feature of each published crate builds alone\n  \
                 services   start the test services and print their environment, until Enter"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Installs npm `packages` (each `name@version`) under `prefix` with the
/// machine's npm, exact versions, quietly; `what` names them in errors.
pub(crate) fn npm_install(prefix: &Path, packages: &[String], what: &str) -> Result<()> {
    std::fs::create_dir_all(prefix).with_context(|| format!("creating {}", prefix.display()))?;
    let status = Command::new("npm")
        .arg("install")
        .arg("--prefix")
        .arg(prefix)
        .args([
            "--save-exact",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .args(packages)
        .status()
        .with_context(|| {
            format!(
                "running npm to install {what}: install Node.js and npm (any version), then retry"
            )
        })?;
    if !status.success() {
        bail!(
            "npm could not install {what} ({status}); check that the npm registry is reachable, then retry"
        );
    }
    Ok(())
}

/// The workspace root (xtask lives one level below it).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// `cargo build` of `targets` (`--example server`, `--bin mcp-persist`, …)
/// with the feature set of `cargo test --workspace --all-features`, so that
/// after the tests it reuses what they built instead of compiling the
/// crates again for another feature set (six minutes of a cold CI run).
///
/// `--all-features` alone is not that set: a build of binaries only leaves
/// dev-dependencies out of feature resolution, and they turn on features of
/// tokio, opentelemetry and others, so tokio and everything above it would
/// be compiled a second time (170 s before the load smoke test). Cargo
/// resolves features for the whole command, and examples need the
/// dev-dependencies, so building the workspace's examples with the targets
/// resolves them as the tests did; `cargo test` has already built those
/// examples, so they cost nothing then.
pub(crate) fn build_as_tested(targets: &[&str]) -> Command {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--quiet",
        "--workspace",
        "--all-features",
        "--examples",
    ])
    .args(targets);
    cmd
}

/// Whether we run under CI, where a missing service is a failure.
pub(crate) fn under_ci() -> bool {
    env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Where xtask keeps downloads and service folders (ignored by git).
pub(crate) fn cache_dir() -> PathBuf {
    root().join(".cache")
}

/// Installs Debian packages with apt-get (after refreshing its lists).
pub(crate) fn apt_install(packages: &[&str]) -> Result<()> {
    let run = |args: &[&str]| -> Result<()> {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get (is this Debian, and are we root?)")?;
        if !status.success() {
            bail!("apt-get {} failed with {status}", args.join(" "));
        }
        Ok(())
    };
    run(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend_from_slice(packages);
    run(&install)
}

/// The `native-tls` feature links the system's OpenSSL, so the all-features
/// builds need its headers: installs Debian's `libssl-dev` when `pkg-config`
/// cannot find them. A failure is reported, and the build then says more.
fn ensure_openssl_headers() {
    let found = Command::new("pkg-config")
        .args(["--exists", "openssl"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        println!("\n==> OpenSSL headers missing (feature native-tls); installing libssl-dev");
        if let Err(e) = apt_install(&["libssl-dev", "pkg-config"]) {
            eprintln!("could not install libssl-dev: {e:#}");
        }
    }
}

struct Step {
    name: &'static str,
    seconds: f64,
    ok: bool,
    /// Free space on the build folder's disk after the step, in GB.
    free_gb: Option<f64>,
}

/// Free space on the disk that holds the workspace, from `df`: a step that
/// fails with "No space left on device" shows in the summary where the
/// space went. `None` where `df` is missing or prints something else.
fn free_disk_gb() -> Option<f64> {
    let out = Command::new("df")
        .args(["-Pk", "."])
        .current_dir(root())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let row = text.lines().nth(1)?;
    let kb: f64 = row.split_whitespace().nth(3)?.parse().ok()?;
    Some(kb / 1e6)
}

fn run_step(steps: &mut Vec<Step>, name: &'static str, mut cmd: Command) -> bool {
    println!("\n==> {name}");
    let started = Instant::now();
    let ok = cmd.status().map(|s| s.success()).unwrap_or_else(|e| {
        eprintln!("could not start {name}: {e}");
        false
    });
    steps.push(Step {
        name,
        seconds: started.elapsed().as_secs_f64(),
        ok,
        free_gb: free_disk_gb(),
    });
    ok
}

/// Runs one of xtask's own tasks as a step, recording its outcome.
fn run_task_step(steps: &mut Vec<Step>, name: &'static str, task: impl FnOnce() -> Result<()>) {
    println!("\n==> {name}");
    let started = Instant::now();
    let ok = task().map_or_else(
        |e| {
            eprintln!("{name}: {e:#}");
            false
        },
        |()| true,
    );
    steps.push(Step {
        name,
        seconds: started.elapsed().as_secs_f64(),
        ok,
        free_gb: free_disk_gb(),
    });
}

/// The clock-step test of the refresh lease runs processes whose wall clock
/// libfaketime moves: installs Debian's `libfaketime` when it is missing.
/// A failure is reported here, and the test then says what is missing.
fn ensure_libfaketime() {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    if !lib.exists() && cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        println!("\n==> libfaketime missing (clock-step test); installing it");
        if let Err(e) = apt_install(&["libfaketime"]) {
            eprintln!("could not install libfaketime: {e:#}");
        }
    }
}

fn test(_args: &[String]) -> Result<()> {
    ensure_openssl_headers();
    ensure_libfaketime();
    let free_at_start = free_disk_gb();
    let mut steps = Vec::new();
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    run_step(&mut steps, "cargo fmt --check", fmt);

    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]);
    run_step(&mut steps, "cargo clippy -D warnings", clippy);

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings");
    run_step(&mut steps, "cargo doc (no broken links)", doc);

    run_task_step(&mut steps, "each feature builds alone", check_features);
    // After the feature sets, whose dependency builds it reuses.
    run_task_step(
        &mut steps,
        "cargo doc (default features)",
        doc_default_features,
    );

    // What a release would upload: manifests, include lists and the
    // family's exact version pins. Not verified by building the packages
    // (that rebuilds every dependency from scratch, about 9 minutes here);
    // the feature checks above build the same sources.
    let mut package = cargo();
    package.args([
        "package",
        "--workspace",
        "--exclude",
        "xtask",
        "--exclude",
        "mcp-persist-conformance",
        "--exclude",
        "mcp-persist-readme",
        "--no-verify",
        "--allow-dirty",
        "--quiet",
    ]);
    run_step(&mut steps, "cargo package --workspace", package);

    println!("\n==> starting services");
    let redis = redis::start().context("starting Redis for the tests")?;
    let moto = moto::start().context("starting moto_server for the tests")?;
    let postgres = postgres::start().context("starting Postgres for the tests")?;

    let mut tests = cargo();
    // Every test binary runs even after one fails, so one run shows every
    // failure.
    tests.args(["test", "--workspace", "--all-features", "--no-fail-fast"]);
    for (k, v) in redis
        .env()
        .into_iter()
        .chain(moto.env())
        .chain(postgres.env())
    {
        tests.env(k, v);
    }
    run_step(&mut steps, "cargo test --workspace", tests);
    drop(postgres);
    drop(moto);
    drop(redis);

    // The product end to end: processes killed with SIGKILL and restarted.
    run_task_step(&mut steps, "cargo xtask demo", || demo::run(&[]));

    // A small fleet under load on the Redis Cluster, one instance SIGKILLed
    // mid-run: fails on any lost or duplicated event.
    run_task_step(&mut steps, "cargo xtask load --quick", || {
        load::run(&["--quick".to_owned()])
    });

    // The official MCP conformance suite, both directions and revisions.
    // Outside CI a machine without npm skips it, saying so; under CI it runs.
    // And the official TypeScript SDK's client against two instances.
    if under_ci() || conformance::available() {
        run_task_step(&mut steps, "conformance suite", || conformance::run(&[]));
        run_task_step(
            &mut steps,
            "interop (TypeScript SDK client, MCP Inspector)",
            || interop::run(&[]),
        );
    } else {
        println!(
            "\n==> conformance suite and interop skipped: npm is not installed (CI runs them)"
        );
    }

    println!("\n==> summary (free disk after each step)");
    if let Some(gb) = free_at_start {
        println!(
            "  {:<4} {:<32} {:>8} {gb:>6.1} GB",
            "", "(at the start)", ""
        );
    }
    for s in &steps {
        let free = s
            .free_gb
            .map_or_else(|| "?".to_owned(), |gb| format!("{gb:.1} GB"));
        println!(
            "  {:<4} {:<32} {:>7.1}s {free:>9}",
            if s.ok { "ok" } else { "FAIL" },
            s.name,
            s.seconds
        );
    }
    let failed: Vec<&str> = steps.iter().filter(|s| !s.ok).map(|s| s.name).collect();
    if failed.is_empty() {
        println!("all {} steps passed", steps.len());
        Ok(())
    } else {
        bail!("failed: {}", failed.join(", "))
    }
}

/// The feature sets of the published crates that must build on their own,
/// each compiled without the rest of the workspace unifying features into
/// it. The facade turns on nothing but the crate a feature names, so
/// `mcp-persist` with `redis` is `mcp-persist-store-redis` (and core) alone,
/// with `client` the transport's `client` alone, and so on: checking the
/// facade checks each crate of the family once. Sets that compile the same
/// code as another are left out: `rustls` and `native-tls` add nothing
/// without `client`, and with it only turn on reqwest's TLS, which the
/// all-features clippy run and the default build already compile.
const FEATURE_SETS: &[(&str, &str)] = &[
    ("mcp-persist", ""),
    // Core and each backend crate alone, as a user depending on one of
    // them builds it: a dependency feature that only another crate of the
    // workspace enables (core's tokio `macros` once) fails here.
    ("mcp-persist-core", ""),
    ("mcp-persist-core", "conformance"),
    ("mcp-persist-store-file", ""),
    ("mcp-persist-store-sqlite", ""),
    ("mcp-persist-store-redis", ""),
    ("mcp-persist-store-vault", ""),
    ("mcp-persist-store-dynamodb", ""),
    ("mcp-persist", "sqlite"),
    ("mcp-persist", "file"),
    ("mcp-persist", "redis"),
    ("mcp-persist", "vault"),
    ("mcp-persist", "postgres"),
    ("mcp-persist-store-postgres", ""),
    ("mcp-persist", "dynamodb"),
    ("mcp-persist-transport-http", ""),
    ("mcp-persist", "server"),
    ("mcp-persist", "client"),
    ("mcp-persist", "auth"),
    // Metrics in core, and the transport's trace context without a server.
    ("mcp-persist", "otel,client"),
    // The README's programs, with exactly the dependencies it lists.
    ("mcp-persist-readme", ""),
];

/// The crates whose docs change with their features, documented one by one
/// with their default features: links to feature-gated items must hold then
/// too, as a user documenting their own project sees them. Crates without
/// features document the same with all of them. One crate per run, so that
/// no other crate unifies a feature into it (and `mcp-persist` and core reuse
/// what the feature sets built).
fn doc_default_features() -> Result<()> {
    for package in [
        "mcp-persist-core",
        "mcp-persist",
        "mcp-persist-transport-http",
    ] {
        let mut cmd = cargo();
        cmd.args(["doc", "--quiet", "--no-deps", "-p", package])
            .env("RUSTDOCFLAGS", "-D warnings");
        if !cmd.status().map(|s| s.success()).unwrap_or(false) {
            bail!("cargo doc -p {package} failed");
        }
    }
    Ok(())
}

/// `cargo check --no-default-features` of every set in [`FEATURE_SETS`],
/// sharing the workspace's target directory so that a dependency built
/// with the same features is built once.
fn check_features() -> Result<()> {
    let mut failed = Vec::new();
    for (package, features) in FEATURE_SETS {
        let mut cmd = cargo();
        cmd.args(["check", "--quiet", "--no-default-features", "-p", package]);
        if !features.is_empty() {
            cmd.args(["--features", features]);
        }
        let label = format!("{package} [{features}]");
        println!("  {label}");
        let started = Instant::now();
        let ok = cmd.status().map(|s| s.success()).unwrap_or(false);
        println!("    {:.1}s", started.elapsed().as_secs_f64());
        if !ok {
            failed.push(label);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("these do not build alone: {}", failed.join("; "))
    }
}

/// A service a benchmark measures against, started by xtask for the run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Service {
    Redis,
    Postgres,
    Moto,
}

/// A benchmark: a `[[bench]]` target (`harness = false`) of its crate,
/// `benches/NAME.rs`, that measures itself against a baseline in the same
/// process and prints an `aim:` line per aim. Examples are only what users
/// read.
struct Bench {
    /// What `cargo xtask bench NAME` selects it by.
    name: &'static str,
    package: &'static str,
    /// The `[[bench]]` target.
    target: &'static str,
    /// Services it needs (their URLs go to it in the environment).
    services: &'static [Service],
    /// Features of its package it needs (`--features`), if any.
    features: &'static str,
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "file",
        package: "mcp-persist-store-file",
        target: "bench_file",
        services: &[],
        features: "",
    },
    Bench {
        name: "sqlite",
        package: "mcp-persist-store-sqlite",
        target: "bench_sqlite",
        services: &[],
        features: "",
    },
    Bench {
        name: "sealing",
        package: "mcp-persist-store-sqlite",
        target: "bench_sealing",
        services: &[],
        features: "",
    },
    Bench {
        name: "redis",
        package: "mcp-persist-store-redis",
        target: "bench_redis",
        services: &[Service::Redis],
        features: "",
    },
    Bench {
        name: "postgres",
        package: "mcp-persist-store-postgres",
        target: "bench_postgres",
        services: &[Service::Postgres],
        features: "",
    },
    Bench {
        name: "dynamodb",
        package: "mcp-persist-lambda-example",
        target: "bench_dynamodb",
        services: &[Service::Moto],
        features: "",
    },
    Bench {
        name: "server",
        package: "mcp-persist-transport-http",
        target: "bench_server",
        services: &[Service::Redis],
        features: "",
    },
    Bench {
        name: "client",
        package: "mcp-persist-transport-http",
        target: "bench_client",
        services: &[Service::Redis, Service::Postgres],
        features: "",
    },
    Bench {
        name: "tasks",
        package: "mcp-persist-transport-http",
        target: "bench_tasks",
        services: &[Service::Redis],
        features: "",
    },
    Bench {
        name: "otel",
        package: "mcp-persist-transport-http",
        target: "bench_otel",
        services: &[],
        features: "otel",
    },
    Bench {
        name: "bus",
        package: "mcp-persist-transport-http",
        target: "bench_bus",
        services: &[Service::Redis, Service::Postgres],
        features: "",
    },
];

/// `cargo xtask bench [NAME...]`: the named benchmarks (all without names),
/// each run as `cargo bench -p PACKAGE --bench TARGET` with the services it
/// needs started first, once for the whole run.
fn bench(args: &[String]) -> Result<()> {
    if let Some(unknown) = args
        .iter()
        .find(|a| !BENCHES.iter().any(|b| b.name == a.as_str()))
    {
        let names: Vec<&str> = BENCHES.iter().map(|b| b.name).collect();
        bail!(
            "no benchmark named {unknown:?}; the benchmarks are: {}",
            names.join(", ")
        );
    }
    let selected: Vec<&Bench> = BENCHES
        .iter()
        .filter(|b| args.is_empty() || args.iter().any(|a| a == b.name))
        .collect();
    let needs = |service: Service| selected.iter().any(|b| b.services.contains(&service));
    let redis = if needs(Service::Redis) {
        Some(redis::start().context("starting Redis for the benchmarks")?)
    } else {
        None
    };
    let postgres = if needs(Service::Postgres) {
        Some(postgres::start().context("starting Postgres for the benchmarks")?)
    } else {
        None
    };
    let moto = if needs(Service::Moto) {
        Some(moto::start().context("starting moto_server for the benchmarks")?)
    } else {
        None
    };
    let mut failed = Vec::new();
    for b in selected {
        println!("\n==> bench {}", b.name);
        let mut cmd = cargo();
        cmd.args(["bench", "--quiet", "-p", b.package, "--bench", b.target]);
        if !b.features.is_empty() {
            cmd.args(["--features", b.features]);
        }
        for service in b.services {
            let env = match service {
                Service::Redis => redis.as_ref().map(|s| s.env()),
                Service::Postgres => postgres.as_ref().map(|s| s.env()),
                Service::Moto => moto.as_ref().map(|s| s.env()),
            };
            cmd.envs(env.into_iter().flatten());
        }
        if !cmd.status().is_ok_and(|s| s.success()) {
            failed.push(b.name);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("benchmarks failed: {}", failed.join(", "))
    }
}

fn services() -> Result<()> {
    let redis = redis::start()?;
    let moto = moto::start()?;
    let postgres = postgres::start()?;
    for (k, v) in redis
        .env()
        .into_iter()
        .chain(moto.env())
        .chain(postgres.env())
    {
        println!("export {k}={v}");
    }
    println!("# services running; press Enter (or close stdin) to stop them");
    // Reading stdin rather than waiting for a signal lets the services' drop
    // run, which stops the servers and removes their folders.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    drop(postgres);
    drop(moto);
    drop(redis);
    Ok(())
}
