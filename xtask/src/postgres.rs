//! Postgres for the tests and benchmarks: a fresh cluster (`initdb`) in a
//! temporary folder, its server on a free 127.0.0.1 port, stopped and
//! removed on drop.
//!
//! The binaries come from `MCP_PERSIST_POSTGRES_BIN` (a folder holding
//! `initdb`, `pg_ctl` and `postgres`) or from Debian's layout,
//! `/usr/lib/postgresql/<version>/bin` (the newest); when there are none,
//! Debian's `postgresql` package is installed with apt-get. Postgres refuses
//! to run as root, so when xtask runs as root the cluster belongs to an
//! unprivileged system user (`postgres` when the package created it, else
//! `nobody`) and every Postgres command runs as that user.
//!
//! The superuser `postgres` logs in over TCP with a password (SCRAM), so
//! that the tests can check a wrong one. The tests learn where it is from:
//!
//! * `MCP_PERSIST_POSTGRES_URL`: `postgres://postgres:PASSWORD@127.0.0.1:PORT/postgres`;
//! * `MCP_PERSIST_POSTGRES_BIN`: the binaries, for tests that run a server
//!   of their own (stopped with `pg_ctl stop -m immediate`);
//! * `MCP_PERSIST_POSTGRES_RUN_AS`: `UID:GID` of the user Postgres runs as
//!   (empty when xtask is not root).
//!
//! Under CI a Postgres that cannot be installed or started is an error;
//! elsewhere it is a warning, and the Postgres tests fail saying how to
//! start it.

use std::{
    env, fs,
    net::{Ipv4Addr, TcpListener},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, anyhow, bail};

/// The variables that tell tests where Postgres is.
const URL_VAR: &str = "MCP_PERSIST_POSTGRES_URL";
const BIN_VAR: &str = "MCP_PERSIST_POSTGRES_BIN";
const RUN_AS_VAR: &str = "MCP_PERSIST_POSTGRES_RUN_AS";

/// A running Postgres server, stopped on drop.
pub(crate) struct PostgresService {
    /// Kept for its `Drop`, which stops the server.
    _server: Option<Server>,
    env: Vec<(String, String)>,
}

impl PostgresService {
    /// The environment variables that tell tests where the server is.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }
}

struct Server {
    bin: PathBuf,
    dir: PathBuf,
    run_as: Option<(u32, u32)>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = as_user(
            Command::new(self.bin.join("pg_ctl"))
                .arg("stop")
                .arg("-D")
                .arg(&data)
                .args(["-m", "fast", "-w", "-s"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            self.run_as,
        )
        .status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Starts Postgres for the tests.
pub(crate) fn start() -> Result<PostgresService> {
    match start_server() {
        Ok(service) => Ok(service),
        Err(e) if !crate::under_ci() => {
            eprintln!(
                "warning: Postgres was not started ({e:#}); the Postgres tests will fail \
                 saying so (install Debian's `postgresql`, or set {BIN_VAR})"
            );
            Ok(PostgresService {
                _server: None,
                env: Vec::new(),
            })
        }
        Err(e) => Err(e),
    }
}

/// The folder of `initdb`, `pg_ctl` and `postgres`.
fn binaries() -> Result<PathBuf> {
    if let Some(dir) = env::var_os(BIN_VAR).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = debian_bin() {
        return Ok(dir);
    }
    println!("postgres: not installed; installing Debian's `postgresql` with apt-get");
    crate::apt_install(&["postgresql"])?;
    debian_bin().ok_or_else(|| {
        anyhow!("no /usr/lib/postgresql/<version>/bin/initdb after installing postgresql")
    })
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb`.
fn debian_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// Who Postgres runs as: nobody special unless we are root, then an
/// unprivileged system user.
fn run_as() -> Result<Option<(u32, u32)>> {
    let me = Command::new("id")
        .arg("-u")
        .output()
        .context("running id -u")?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return Ok(None);
    }
    for user in ["postgres", "nobody"] {
        let uid = Command::new("id").args(["-u", user]).output();
        let gid = Command::new("id").args(["-g", user]).output();
        if let (Ok(uid), Ok(gid)) = (uid, gid)
            && uid.status.success()
            && gid.status.success()
        {
            let parse = |out: &[u8]| String::from_utf8_lossy(out).trim().parse::<u32>();
            return Ok(Some((parse(&uid.stdout)?, parse(&gid.stdout)?)));
        }
    }
    bail!("running as root, and neither the `postgres` nor the `nobody` user exists")
}

/// `cmd`, run as `user` when given.
fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    cmd
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A password for this run only: letters and digits from the clock and the
/// process id, so it needs no escaping in a URL.
fn password() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("pw{:x}{:x}", nanos, std::process::id())
}

fn start_server() -> Result<PostgresService> {
    let bin = binaries()?;
    let run_as = run_as()?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    // Under the system's temporary folder, which any user can reach (the
    // workspace may sit under a folder only root can enter).
    let dir = env::temp_dir().join(format!(
        "mcp-persist-postgres-{}-{nanos}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .with_context(|| format!("giving {} to uid {uid}", dir.display()))?;
    }
    let server = Server {
        bin: bin.clone(),
        dir: dir.clone(),
        run_as,
    };
    let password = password();
    let pwfile = dir.join("pwfile");
    fs::write(&pwfile, format!("{password}\n"))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))?;
    }
    let data = dir.join("data");
    let log = dir.join("initdb.log");
    let status = as_user(
        Command::new(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-E", "UTF8", "--locale=C"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log)?)
            .stderr(fs::File::create(dir.join("initdb.err"))?),
        run_as,
    )
    .status()
    .with_context(|| format!("running {}", bin.join("initdb").display()))?;
    if !status.success() {
        bail!(
            "initdb failed with {status}:\n{}",
            fs::read_to_string(dir.join("initdb.err")).unwrap_or_default()
        );
    }
    let _ = fs::remove_file(&pwfile);
    let mut last = None;
    for _ in 0..3 {
        let port = free_port()?;
        match start_on(&bin, &dir, run_as, port) {
            Ok(()) => {
                let url = format!("postgres://postgres:{password}@127.0.0.1:{port}/postgres");
                println!(
                    "postgres: {} on port {port}, data in {}",
                    bin.display(),
                    data.display()
                );
                let run_as_text = run_as.map(|(u, g)| format!("{u}:{g}")).unwrap_or_default();
                return Ok(PostgresService {
                    _server: Some(server),
                    env: vec![
                        (URL_VAR.into(), url),
                        (BIN_VAR.into(), bin.display().to_string()),
                        (RUN_AS_VAR.into(), run_as_text),
                    ],
                });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried at least once"))
}

/// Starts the server with `pg_ctl start -w` (it waits until connections
/// are accepted).
fn start_on(bin: &Path, dir: &Path, run_as: Option<(u32, u32)>, port: u16) -> Result<()> {
    let data = dir.join("data");
    let log = dir.join("server.log");
    let options = format!(
        "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
         -c max_connections=400 -c shared_buffers=128MB",
        dir.display()
    );
    let status = as_user(
        Command::new(bin.join("pg_ctl"))
            .arg("start")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-s"])
            .arg("-o")
            .arg(options)
            .stdin(Stdio::null()),
        run_as,
    )
    .status()
    .context("running pg_ctl start")?;
    if !status.success() {
        let text = fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        bail!(
            "pg_ctl start failed with {status}; the server log ends with:\n{}",
            lines[lines.len().saturating_sub(15)..].join("\n")
        );
    }
    Ok(())
}
