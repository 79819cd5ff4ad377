//! `cargo xtask load`: a fleet of durable servers on one store, under load.
//!
//! ```text
//! cargo xtask load [--backend redis-cluster|redis|sqlite|postgres] [--sessions N]
//!                  [--instances M] [--seconds S] [--concurrency C] [--reference R] [--quick]
//! ```
//!
//! Starts the store (a three-node Redis Cluster by default, or a standalone
//! Redis, a SQLite file, Postgres), builds the `mcp-persist-load` program of
//! the conformance package and runs its `drive` command: M server processes
//! on that store, a reference phase of R sessions, then N sessions of the
//! realistic mix with the fleet bus announcing meanwhile, one instance killed
//! with SIGKILL when 40 % have started and started again, and the store
//! measured from the backend, then the R sessions again on the full store.
//! It prints the capacity table and writes every
//! figure to `.cache/load/<backend>.json`. It fails when an event was lost
//! or duplicated.
//!
//! `--quick` is the smoke test `cargo xtask test` runs: 300 sessions on
//! three instances of the cluster, no reference phase, within a minute;
//! outside CI, on a machine without Redis, on a SQLite file instead.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// What `load` was asked for.
struct Options {
    backend: String,
    pass: Vec<String>,
    quick: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        backend: "redis-cluster".into(),
        pass: Vec::new(),
        quick: false,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--quick" => o.quick = true,
            "--backend" => {
                o.backend = args.next().context("--backend needs a value")?.clone();
            }
            "--sessions" | "--instances" | "--seconds" | "--concurrency" | "--reference" => {
                let value = args
                    .next()
                    .with_context(|| format!("{flag} needs a value"))?;
                value
                    .parse::<u64>()
                    .with_context(|| format!("{flag} takes a whole number, not {value:?}"))?;
                o.pass.push(flag.clone());
                o.pass.push(value.clone());
            }
            other => bail!(
                "unknown flag {other}\nusage: cargo xtask load [--backend redis-cluster|redis|sqlite|postgres] \
                 [--sessions N] [--instances M] [--seconds S] [--concurrency C] [--reference R] [--quick]"
            ),
        }
    }
    if !matches!(
        o.backend.as_str(),
        "redis-cluster" | "redis" | "sqlite" | "postgres"
    ) {
        bail!(
            "unknown backend {}: redis-cluster, redis, sqlite or postgres",
            o.backend
        );
    }
    Ok(o)
}

/// The value of `name` among a service's variables.
fn var(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .filter(|v| !v.is_empty())
}

/// `cargo xtask load`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let options = parse(args)?;
    let folder = crate::cache_dir().join("load");
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;

    println!("building the load driver and its servers");
    let status = crate::build_as_tested(&["--bin", "mcp-persist-load"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building mcp-persist-load failed");
    }
    let exe = target_dir().join("debug").join("mcp-persist-load");

    // The services stay up while the driver runs; dropping them stops them.
    let mut redis = None;
    let mut postgres = None;
    let run_dir = folder.join(format!("run-{}", std::process::id()));
    let sqlite = || -> Result<String> {
        std::fs::create_dir_all(&run_dir)?;
        Ok(format!("sqlite:{}", run_dir.join("load.db").display()))
    };
    let store = match options.backend.as_str() {
        "redis-cluster" | "redis" => {
            let services = crate::redis::start().context("starting Redis")?;
            let env = services.env();
            redis = Some(services);
            let name = if options.backend == "redis" {
                "MCP_PERSIST_REDIS_URL"
            } else {
                "MCP_PERSIST_REDIS_CLUSTER_URLS"
            };
            match var(&env, name) {
                Some(url) if options.backend == "redis" => url,
                Some(urls) => {
                    let nodes: Vec<&str> = urls
                        .split(',')
                        .map(|u| {
                            u.trim()
                                .trim_start_matches("redis://")
                                .trim_end_matches('/')
                        })
                        .collect();
                    format!("redis+cluster://{}", nodes.join(","))
                }
                // Outside CI a machine without Redis still gets the smoke
                // test, on a SQLite file; under CI Redis failing to start
                // failed above.
                None if options.quick => {
                    eprintln!("warning: no Redis here: the load smoke test runs on SQLite instead");
                    sqlite()?
                }
                None => bail!("Redis did not start (see the warning above)"),
            }
        }
        "postgres" => {
            let service = crate::postgres::start().context("starting Postgres")?;
            let url = var(&service.env(), "MCP_PERSIST_POSTGRES_URL")
                .context("Postgres did not start (see the warning above)")?;
            postgres = Some(service);
            url
        }
        _ => sqlite()?,
    };

    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("drive").arg("--store").arg(&store);
    if options.quick {
        cmd.args([
            "--sessions",
            "300",
            "--instances",
            "3",
            "--seconds",
            "60",
            "--concurrency",
            "32",
            "--reference",
            "0",
        ]);
    }
    cmd.args(&options.pass);
    let json = folder.join(format!(
        "{}{}.json",
        options.backend,
        if options.quick { "-quick" } else { "" }
    ));
    cmd.arg("--json").arg(&json);
    std::fs::create_dir_all(&run_dir)?;
    cmd.arg("--dir").arg(&run_dir);
    let status = cmd
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    drop(redis);
    drop(postgres);
    if !status.success() {
        bail!(
            "the load run failed ({status}); the instances' logs are in {}",
            run_dir.display()
        );
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    println!("figures written to {}", json.display());
    Ok(())
}

/// Where cargo puts what it builds for this workspace.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target"))
}
