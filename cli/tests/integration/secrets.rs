//! Every secret field of every declared record kind, planted in real stores,
//! never reaches the command line's output, its errors or its trace log,
//! whatever command reads it, in tables or JSON.

use crate::support::*;
use mcp_persist_core::{
    PutOptions,
    conformance::samples::{self, PLANTED},
    declare::Space,
};

async fn plant_every_kind(url: &str) -> anyhow::Result<Vec<(String, Space)>> {
    let stores = mcp_persist::backends()
        .open(url, mcp_persist::registry::OpenOptions::default())
        .await?;
    let mut names = Vec::new();
    for sample in samples::all() {
        match sample.declaration.space {
            Space::Kv => {
                stores
                    .kv
                    .put(&sample.key, sample.bytes.clone(), PutOptions::default())
                    .await?;
            }
            Space::Log => {
                let log = stores.log.as_ref().expect("a store with logs");
                log.append(&sample.key, vec![sample.bytes.clone()], None)
                    .await?;
            }
        }
        assert!(
            sample.secrets.len() == sample.declaration.secret_fields.len(),
            "{}: one planted secret per declared secret field",
            sample.declaration.kind
        );
        names.push((sample.key.to_string(), sample.declaration.space));
    }
    stores.close().await?;
    Ok(names)
}

async fn no_secret_in_any_output(scheme: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = match scheme {
        "sqlite" => format!("sqlite:{}", dir.path().join("s.db").display()),
        _ => format!("file:{}", dir.path().join("store").display()),
    };
    let names = plant_every_kind(&url).await?;
    let mut runs: Vec<Vec<String>> = Vec::new();
    for json in [false, true] {
        let mut base = if json {
            vec!["--json".to_owned()]
        } else {
            vec![]
        };
        for command in [
            vec!["ls", &url, "sessions"],
            vec!["ls", &url, "events"],
            vec!["ls", &url, "clients"],
            vec!["ls", &url, "credentials"],
            vec!["ls", &url, "tasks"],
            vec!["ls", &url, "keys"],
            vec!["stats", &url],
            vec!["check", &url],
            vec!["gc", &url, "--dry-run"],
        ] {
            let mut run = base.clone();
            run.extend(command.iter().map(|s| (*s).to_owned()));
            runs.push(run);
        }
        for (name, _) in &names {
            let mut run = base.clone();
            run.extend(["show".to_owned(), url.clone(), name.clone()]);
            runs.push(run);
        }
        base.clear();
    }
    let mut redacted = 0;
    let count = runs.len();
    for run in runs {
        let args: Vec<&str> = run.iter().map(String::as_str).collect();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-persist"))
            .args(&args)
            .env("MCP_PERSIST_LOG", "trace")
            .output()?;
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(
            !all.contains(PLANTED),
            "{args:?} printed a planted secret:\n{all}"
        );
        // The command did read the records: `show` of a secret-bearing kind
        // prints its other fields and the redaction marker.
        if args.contains(&"show") {
            assert_eq!(out.status.code(), Some(0), "{args:?}: {all}");
            redacted += usize::from(all.contains("[redacted]"));
        }
    }
    // Every kind with secrets was shown, twice (table and JSON), redacted.
    let with_secrets = samples::all()
        .iter()
        .filter(|s| !s.declaration.secret_fields.is_empty())
        .count();
    assert_eq!(redacted, 2 * with_secrets, "of {count} runs");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_output_of_any_command_on_sqlite() -> anyhow::Result<()> {
    no_secret_in_any_output("sqlite").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_output_of_any_command_on_a_file_store() -> anyhow::Result<()> {
    no_secret_in_any_output("file").await
}
