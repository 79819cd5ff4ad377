//! Redis for the tests and benchmarks: a standalone server and a three-node
//! cluster on free loopback ports, in a fresh folder under `.cache/redis/`
//! that is removed with them, stopped on drop.
//!
//! `redis-server` comes from `MCP_PERSIST_REDIS_SERVER_BIN` or `PATH`; when
//! it is missing, Debian's `redis-server` package is installed with apt-get.
//! The servers keep nothing on disk (`--save ""`, no AOF). Their addresses
//! reach the tests through:
//!
//! * `MCP_PERSIST_REDIS_URL`: the standalone server, `redis://127.0.0.1:PORT/`;
//! * `MCP_PERSIST_REDIS_CLUSTER_URLS`: the cluster's nodes, comma-separated;
//! * `MCP_PERSIST_REDIS_SERVER_BIN` and `MCP_PERSIST_REDIS_BENCHMARK_BIN`:
//!   the binaries, for tests that run a server of their own and for the
//!   benchmark's baseline.
//!
//! Under CI a failure to start is an error; elsewhere it is a warning, and
//! the Redis tests skip with a notice.

use std::{
    env,
    fs::{self, File},
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, anyhow, bail};

/// How long a server may take to answer `PING` after it was started.
const READY_WITHIN: Duration = Duration::from_secs(15);
/// How long the cluster may take to report `cluster_state:ok`.
const CLUSTER_OK_WITHIN: Duration = Duration::from_secs(30);
/// Pause between two readiness probes.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// Running Redis servers, stopped on drop.
pub(crate) struct RedisServices {
    servers: Vec<Server>,
    dir: Option<PathBuf>,
    env: Vec<(String, String)>,
}

impl RedisServices {
    /// The environment variables that tell tests where the servers are.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }
}

impl Drop for RedisServices {
    fn drop(&mut self) {
        for server in &mut self.servers {
            server.stop();
        }
        if let Some(dir) = &self.dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Starts the Redis servers the tests need.
pub(crate) fn start() -> Result<RedisServices> {
    match start_all() {
        Ok(services) => Ok(services),
        Err(e) if !crate::under_ci() => {
            eprintln!("warning: Redis was not started ({e:#}); the Redis tests will skip");
            Ok(RedisServices {
                servers: Vec::new(),
                dir: None,
                env: Vec::new(),
            })
        }
        Err(e) => Err(e),
    }
}

struct Binaries {
    server: PathBuf,
    cli: PathBuf,
    benchmark: Option<PathBuf>,
}

fn start_all() -> Result<RedisServices> {
    let bins = binaries()?;
    let dir = temp_folder()?;
    let mut services = RedisServices {
        servers: Vec::new(),
        dir: Some(dir.clone()),
        env: Vec::new(),
    };

    let standalone = Server::start(&bins.server, &dir, false)?;
    let url = standalone.url();
    services.servers.push(standalone);

    let mut nodes = Vec::new();
    for _ in 0..3 {
        let node = Server::start(&bins.server, &dir, true)?;
        nodes.push(node.port);
        services.servers.push(node);
    }
    create_cluster(&bins.cli, &nodes, &dir)?;
    let cluster_urls: Vec<String> = nodes
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}/"))
        .collect();
    println!(
        "redis: standalone on port {}, cluster on ports {}",
        services.servers[0].port,
        nodes
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );

    services.env = vec![
        ("MCP_PERSIST_REDIS_URL".into(), url),
        (
            "MCP_PERSIST_REDIS_CLUSTER_URLS".into(),
            cluster_urls.join(","),
        ),
        (
            "MCP_PERSIST_REDIS_SERVER_BIN".into(),
            bins.server.display().to_string(),
        ),
    ];
    if let Some(benchmark) = bins.benchmark {
        services.env.push((
            "MCP_PERSIST_REDIS_BENCHMARK_BIN".into(),
            benchmark.display().to_string(),
        ));
    }
    Ok(services)
}

/// Finds `name` in `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// The Redis binaries, installing Debian's package when they are missing.
fn binaries() -> Result<Binaries> {
    let from_env = env::var_os("MCP_PERSIST_REDIS_SERVER_BIN").map(PathBuf::from);
    let server = match from_env.or_else(|| on_path("redis-server")) {
        Some(path) => path,
        None => {
            install_redis()?;
            on_path("redis-server")
                .ok_or_else(|| anyhow!("redis-server is still not on PATH after installing it"))?
        }
    };
    // redis-cli and redis-benchmark ship next to the server (Debian's
    // redis-tools, a dependency of redis-server).
    let sibling = |name: &str| {
        server
            .parent()
            .map(|dir| dir.join(name))
            .filter(|p| p.is_file())
            .or_else(|| on_path(name))
    };
    let cli = sibling("redis-cli").ok_or_else(|| anyhow!("redis-cli not found"))?;
    Ok(Binaries {
        benchmark: sibling("redis-benchmark"),
        server,
        cli,
    })
}

fn install_redis() -> Result<()> {
    println!("redis-server is not installed; installing Debian's package with apt-get");
    crate::apt_install(&["redis-server"])
}

fn temp_folder() -> Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    // Under the git-ignored cache folder, one fresh folder per run.
    let dir = crate::cache_dir()
        .join("redis")
        .join(format!("{}-{nanos}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A port nobody listens on right now (the server may still lose a race
/// for it, and is then started again on another).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

struct Server {
    child: Option<Child>,
    port: u16,
}

impl Server {
    /// Starts a server and waits until it answers `PING`; tries other ports
    /// when the one picked was taken meanwhile.
    fn start(bin: &Path, dir: &Path, cluster: bool) -> Result<Server> {
        let mut last_error = None;
        for _ in 0..3 {
            match Server::try_start(bin, dir, cluster) {
                Ok(server) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("the loop ran at least once"))
    }

    fn try_start(bin: &Path, dir: &Path, cluster: bool) -> Result<Server> {
        let port = free_port()?;
        let log = dir.join(format!("redis-{port}.log"));
        let mut cmd = Command::new(bin);
        cmd.args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if cluster {
            let bus = free_port()?;
            cmd.args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-port", &bus.to_string()])
                .args(["--cluster-node-timeout", "5000"]);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut server = Server {
            child: Some(child),
            port,
        };
        server.wait_ready(&log)?;
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn wait_ready(&mut self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "redis-server on port {} exited with {status}; its log ends with:\n{}",
                    self.port,
                    tail(log)
                );
            }
            if matches!(command(self.port, "PING").as_deref(), Ok("PONG")) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                bail!(
                    "redis-server on port {} did not answer PING within {READY_WITHIN:?}; its log ends with:\n{}",
                    self.port,
                    tail(log)
                );
            }
            thread::sleep(PROBE_EVERY);
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Joins the nodes into a cluster with `redis-cli --cluster create` and
/// waits until every node reports `cluster_state:ok`.
fn create_cluster(cli: &Path, ports: &[u16], dir: &Path) -> Result<()> {
    let log_path = dir.join("cluster-create.log");
    let log = File::create(&log_path)?;
    let status = Command::new(cli)
        .args(["--cluster", "create"])
        .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("running {}", cli.display()))?;
    if !status.success() {
        bail!(
            "redis-cli --cluster create failed with {status}:\n{}",
            tail(&log_path)
        );
    }
    let deadline = Instant::now() + CLUSTER_OK_WITHIN;
    for &port in ports {
        loop {
            let info = command(port, "CLUSTER INFO").unwrap_or_default();
            if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "the cluster node on port {port} did not report cluster_state:ok within {CLUSTER_OK_WITHIN:?}"
                );
            }
            thread::sleep(PROBE_EVERY);
        }
    }
    Ok(())
}

/// Sends one inline command to the server on `port` and returns its reply
/// (a status, a bulk string or an integer) as text.
fn command(port: u16, line: &str) -> Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{line}\r\n").as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let first = first.trim_end();
    let (kind, rest) = first.split_at_checked(1).unwrap_or(("", ""));
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => bail!("{line}: {rest}"),
        "$" => {
            let len: i64 = rest.parse().context("bulk length")?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(String::new());
            };
            let mut body = vec![0u8; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            Ok(String::from_utf8_lossy(&body).into_owned())
        }
        _ => bail!("{line}: unexpected reply {first:?}"),
    }
}
