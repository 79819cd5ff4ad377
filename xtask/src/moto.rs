//! `moto_server`, a local stand-in for AWS Secrets Manager, for the tests of
//! the Secrets Manager backend.
//!
//! moto comes from PyPI (`moto[server]`), installed on first use into a
//! virtual environment under the workspace's `.cache/`. The server listens
//! on a free loopback port and its address reaches the tests as
//! `MCP_PERSIST_MOTO_URL`. `MCP_PERSIST_MOTO_SERVER` names another
//! `moto_server` executable; an `MCP_PERSIST_MOTO_URL` already set is used
//! as it is, and nothing is started.
//!
//! Outside CI, a moto that cannot be installed or started is a warning and
//! the tests that need it skip; under CI it is an error.
//!
//! `moto_server` serves each request on a thread of its own and does not
//! lock its DynamoDB tables or its secrets, so two conditional writes to one
//! item can both pass their condition, and two `UpdateSecretVersionStage`
//! calls can both move `AWSCURRENT` off the same version (moto checks, then
//! moves, without a lock). The installed moto is therefore started through
//! [`SERIAL_MOTO`], which lets one DynamoDB or Secrets Manager request at a
//! time reach moto's backend: the per-request atomicity both services give.
//! Other services' requests are served as before.
//! A `moto_server` named by `MCP_PERSIST_MOTO_SERVER` runs as it is.

use std::{
    env,
    fs::{self, File},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// The variable that tells tests where moto listens.
const URL_VAR: &str = "MCP_PERSIST_MOTO_URL";
/// The variable that names another `moto_server` executable.
const SERVER_VAR: &str = "MCP_PERSIST_MOTO_SERVER";
/// Starts moto's server with every DynamoDB and Secrets Manager request
/// handled under one lock (arguments as `moto_server`'s).
const SERIAL_MOTO: &str = "\
import sys, threading
import moto.server as server
run = server.run_simple
def run_serial(host, port, app, **options):
    lock = threading.Lock()
    def serial(environ, start_response):
        target = environ.get('HTTP_X_AMZ_TARGET', '')
        if not target.startswith(('DynamoDB_', 'secretsmanager.')):
            return app(environ, start_response)
        with lock:
            return list(app(environ, start_response))
    return run(host, port, serial, **options)
server.run_simple = run_serial
server.main(sys.argv[1:])
";
/// How long moto may take to start listening.
const STARTUP: Duration = Duration::from_secs(60);

/// A running `moto_server` (or the address of one started elsewhere),
/// stopped on drop.
pub(crate) struct MotoService {
    child: Option<Child>,
    url: Option<String>,
}

impl MotoService {
    /// The environment variables that tell tests where moto is.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.url
            .iter()
            .map(|url| (URL_VAR.to_owned(), url.clone()))
            .collect()
    }
}

impl Drop for MotoService {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `moto_server`, installing moto first when it is missing.
pub(crate) fn start() -> Result<MotoService> {
    if let Ok(url) = env::var(URL_VAR)
        && !url.is_empty()
    {
        println!("moto: using {url} from {URL_VAR}");
        return Ok(MotoService {
            child: None,
            url: Some(url),
        });
    }
    match start_local() {
        Ok(service) => Ok(service),
        Err(e) if !crate::under_ci() => {
            eprintln!(
                "moto: not available, the Secrets Manager tests will skip: {e:#}\n\
                 (install it with: python3 -m venv .cache/moto-venv && \
                 .cache/moto-venv/bin/pip install 'moto[server]')"
            );
            Ok(MotoService {
                child: None,
                url: None,
            })
        }
        Err(e) => Err(e),
    }
}

fn start_local() -> Result<MotoService> {
    let (server, serial) = match env::var_os(SERVER_VAR) {
        Some(path) => (PathBuf::from(path), false),
        None => (installed_server()?, true),
    };
    let log_path = crate::cache_dir().join("moto.log");
    // A free port can be taken between our probe and moto's bind: try again.
    let mut last_error = None;
    for _ in 0..3 {
        let port = free_port()?;
        match spawn(&server, serial, port, &log_path) {
            Ok(service) => return Ok(service),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.expect("three attempts ran"))
}

/// The `moto_server` of the workspace's virtual environment, installed
/// there first if it is missing.
fn installed_server() -> Result<PathBuf> {
    let venv = crate::cache_dir().join("moto-venv");
    let server = venv.join("bin").join("moto_server");
    if server.is_file() {
        return Ok(server);
    }
    println!("moto: installing moto[server] into {}", venv.display());
    fs::create_dir_all(crate::cache_dir()).context("creating the cache folder")?;
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        .context("creating a Python virtual environment (is python3 with venv installed?)")?;
    run(Command::new(venv.join("bin").join("pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "moto[server]",
    ]))
    .context("installing moto[server] from PyPI")?;
    if !server.is_file() {
        bail!("moto installed, but {} is missing", server.display());
    }
    Ok(server)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} failed: {status}", cmd.get_program());
    }
    Ok(())
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

fn spawn(server: &Path, serial: bool, port: u16, log_path: &Path) -> Result<MotoService> {
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    // The virtual environment's python, beside its `moto_server`.
    let mut command = match server.parent().map(|bin| bin.join("python3")) {
        Some(python) if serial && python.is_file() => {
            let mut command = Command::new(python);
            command.args(["-c", SERIAL_MOTO]);
            command
        }
        _ => Command::new(server),
    };
    let child = command
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", server.display()))?;
    // From here on, dropping the service stops the server.
    let mut service = MotoService {
        child: Some(child),
        url: None,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + STARTUP;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            break;
        }
        let child = service.child.as_mut().expect("set above");
        if let Some(status) = child.try_wait()? {
            let log = fs::read_to_string(log_path).unwrap_or_default();
            bail!("moto_server exited at start ({status}):\n{log}");
        }
        if Instant::now() >= deadline {
            bail!("moto_server did not listen on {addr} within {STARTUP:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://{addr}");
    println!("moto: listening on {url}");
    service.url = Some(url);
    Ok(service)
}
