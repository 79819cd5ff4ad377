//! What the integration tests share: where the test Postgres is, and a
//! server of a test's own for the tests that stop it.
//!
//! `cargo xtask test` starts a server and passes it in
//! `MCP_PERSIST_POSTGRES_URL` (and its binaries in `MCP_PERSIST_POSTGRES_BIN`,
//! the user it runs as in `MCP_PERSIST_POSTGRES_RUN_AS`). A missing variable
//! fails the test, saying how to start Postgres: these tests never skip.

#![allow(dead_code, unreachable_pub)]

use std::{
    fs,
    net::{Ipv4Addr, TcpListener},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use mcp_persist_store_postgres::PostgresStore;

pub const URL_VAR: &str = "MCP_PERSIST_POSTGRES_URL";
pub const BIN_VAR: &str = "MCP_PERSIST_POSTGRES_BIN";
pub const RUN_AS_VAR: &str = "MCP_PERSIST_POSTGRES_RUN_AS";

fn var(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "{name} is not set: start Postgres with `cargo xtask services` (or run `cargo xtask test`)"
        ),
    }
}

/// The test server's URL (with its password).
pub fn url() -> String {
    var(URL_VAR)
}

/// A schema name no other test uses.
pub fn unique_schema(what: &str) -> String {
    use std::{
        collections::hash_map::RandomState,
        hash::{BuildHasher, Hasher},
    };
    let salt = RandomState::new().build_hasher().finish() & 0xffff_ffff;
    format!("{what}_{}_{salt:x}", std::process::id())
}

/// A new store (a new pool) in `schema` of the test server.
pub async fn open(schema: &str) -> PostgresStore {
    PostgresStore::builder(&url())
        .schema(schema)
        .operation_timeout(Duration::from_secs(20))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to the test Postgres failed: {e}"))
}

/// Runs one SQL script on the test server with the tokio-postgres client.
pub async fn admin(sql: &str) {
    admin_at(&url(), sql).await
}

pub async fn admin_at(url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    let task = tokio::spawn(connection);
    client.batch_execute(sql).await.expect("admin SQL");
    drop(client);
    let _ = task.await;
}

/// The user Postgres runs as, when the tests run as root.
fn run_as() -> Option<(u32, u32)> {
    let text = std::env::var(RUN_AS_VAR).ok()?;
    let (u, g) = text.trim().split_once(':')?;
    Some((u.parse().ok()?, g.parse().ok()?))
}

/// A Postgres server of this test's own: its own cluster in a temporary
/// folder, started and stopped at will (`pg_ctl stop -m immediate`).
pub struct OwnServer {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    run_as: Option<(u32, u32)>,
    tls: bool,
}

impl OwnServer {
    /// Creates the cluster (user `postgres`, trust on loopback) and starts it.
    pub fn start() -> OwnServer {
        Self::start_with(false)
    }

    /// The same, serving TLS with a certificate of its own for `localhost`
    /// and 127.0.0.1 (see [`OwnServer::certificate`]).
    pub fn start_tls() -> OwnServer {
        Self::start_with(true)
    }

    /// The PEM of the CA that signed the certificate a TLS server presents.
    pub fn certificate(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn start_with(tls: bool) -> OwnServer {
        let bin = PathBuf::from(var(BIN_VAR));
        let run_as = run_as();
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("mcp-persist-pg-test-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).expect("test folder");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
        }
        let server = OwnServer {
            bin,
            dir,
            port,
            run_as,
            tls,
        };
        if tls {
            // A CA of this test's own, and the server's certificate signed by it.
            let openssl = |args: &[&str]| {
                let status = Command::new("openssl")
                    .args(args)
                    .current_dir(&server.dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .expect("run openssl");
                assert!(status.success(), "openssl {args:?} failed: {status}");
            };
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=mcp-persist test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ]);
            openssl(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ]);
            fs::write(
                server.dir.join("server.ext"),
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
            )
            .expect("extensions");
            openssl(&[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ]);
            for file in ["server.key", "server.crt"] {
                let path = server.dir.join(file);
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
                if let Some((uid, gid)) = run_as {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
                }
            }
        }
        let status = server
            .command("initdb")
            .arg("-D")
            .arg(server.dir.join("data"))
            .args(["-U", "postgres", "-E", "UTF8", "--locale=C", "--auth=trust"])
            .stdout(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed: {status}");
        server.up();
        server
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid).env("HOME", "/tmp");
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it accepts connections.
    pub fn up(&self) {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=200",
            self.port,
            self.dir.display()
        );
        if self.tls {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
                self.dir.display()
            ));
        }
        let status = self
            .command("pg_ctl")
            .arg("start")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "-s", "-o", &options])
            .status()
            .expect("run pg_ctl start");
        assert!(status.success(), "pg_ctl start failed: {status}");
    }

    /// `pg_ctl stop -m immediate`: the server quits without a checkpoint,
    /// as in a crash; what it acknowledged must be recovered from its WAL.
    pub fn crash(&self) {
        let status = self
            .command("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "-s"])
            .status()
            .expect("run pg_ctl stop");
        assert!(status.success(), "pg_ctl stop failed: {status}");
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "-s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
