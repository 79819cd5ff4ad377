//! The fleet: server processes on 127.0.0.1 sharing one store, started,
//! killed with SIGKILL and started again.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::Mutex,
};

/// How long an instance may take to print `LISTENING`.
const START_WITHIN: Duration = Duration::from_secs(60);

/// Server processes of one store.
pub struct Fleet {
    exe: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    instances: Vec<Mutex<Instance>>,
    ports: Vec<u16>,
}

struct Instance {
    child: Option<Child>,
}

impl Fleet {
    /// Starts `count` instances of `exe serve --store-url <store> <args>`,
    /// their logs in `dir`.
    pub async fn start(
        exe: &Path,
        store: &str,
        args: &[String],
        count: usize,
        dir: &Path,
    ) -> Result<Fleet> {
        let mut all = vec![
            "serve".to_owned(),
            "--store-url".to_owned(),
            store.to_owned(),
        ];
        all.extend(args.iter().cloned());
        let mut fleet = Fleet {
            exe: exe.to_owned(),
            args: all,
            dir: dir.to_owned(),
            instances: Vec::new(),
            ports: Vec::new(),
        };
        for i in 0..count {
            let (child, port) = fleet.spawn(i, 0).await?;
            fleet
                .instances
                .push(Mutex::new(Instance { child: Some(child) }));
            fleet.ports.push(port);
        }
        Ok(fleet)
    }

    async fn spawn(&self, index: usize, port: u16) -> Result<(Child, u16)> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("instance-{index}.log")))
            .context("opening an instance log")?;
        let mut child = Command::new(&self.exe)
            .args(&self.args)
            .args(["--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        let stdout = child.stdout.take().context("instance stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let listening = tokio::time::timeout(START_WITHIN, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix("LISTENING ") {
                    return Ok::<_, std::io::Error>(Some(addr.trim().to_owned()));
                }
            }
            Ok(None)
        })
        .await;
        let addr = match listening {
            Ok(Ok(Some(addr))) => addr,
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = child.wait().await.ok();
                bail!(
                    "instance {index} exited before listening ({status:?}); see {}",
                    self.dir.join(format!("instance-{index}.log")).display()
                )
            }
            Err(_) => bail!("instance {index} did not listen within {START_WITHIN:?}"),
        };
        let port = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("instance {index} printed a strange address {addr}"))?;
        // Keep reading stdout so that the instance never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((child, port))
    }

    /// How many instances the fleet has.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// Whether the fleet has no instance.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// The MCP endpoint of instance `index` (modulo the fleet's size).
    pub fn url(&self, index: usize) -> String {
        format!(
            "http://127.0.0.1:{}/mcp",
            self.ports[index % self.ports.len()]
        )
    }

    /// Kills instance `index` with SIGKILL and waits for it to be gone.
    pub async fn kill(&self, index: usize) -> Result<()> {
        let mut instance = self.instances[index].lock().await;
        if let Some(mut child) = instance.child.take() {
            child.start_kill().context("SIGKILL")?;
            child
                .wait()
                .await
                .context("waiting for the killed instance")?;
        }
        Ok(())
    }

    /// Starts instance `index` again, on the port it had.
    pub async fn restart(&self, index: usize) -> Result<()> {
        let mut instance = self.instances[index].lock().await;
        let mut last = None;
        // The port may take a moment to be free again.
        for _ in 0..20 {
            match self.spawn(index, self.ports[index]).await {
                Ok((child, _)) => {
                    instance.child = Some(child);
                    return Ok(());
                }
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("instance {index} did not start again")))
    }

    /// Stops every instance (SIGKILL: nothing is left to flush that the
    /// store does not already hold).
    pub async fn stop(&self) {
        for index in 0..self.instances.len() {
            let _ = self.kill(index).await;
        }
    }
}
