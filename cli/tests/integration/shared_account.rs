//! A Secrets Manager account is shared with other applications. A store URL
//! whose `prefix=` is empty would claim every secret in it: `ls` would list
//! them, and `rm` replaced another application's value with a tombstone that
//! `gc` then deletes for good. Every command refuses such a URL before it
//! reads anything, on every run, and the other application's secret keeps
//! its value and its version.

use crate::support::*;
use mcp_persist_store_vault::aws_sdk_secretsmanager::Client;

/// The current version id and value of secret `name`.
async fn current(client: &Client, name: &str) -> anyhow::Result<(String, String)> {
    let out = client.get_secret_value().secret_id(name).send().await?;
    Ok((
        out.version_id().unwrap_or_default().to_owned(),
        out.secret_string().unwrap_or_default().to_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_secrets_manager_prefix_is_refused_and_no_foreign_secret_changes()
-> anyhow::Result<()> {
    let Some(moto) = service_var(MOTO_VAR) else {
        return Ok(());
    };
    let client = secrets_client(&moto);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let foreign = format!("other-app-{}-{nanos}/db-password", std::process::id());
    client
        .create_secret()
        .name(&foreign)
        .secret_string("other application's value")
        .send()
        .await?;
    let before = current(&client, &foreign).await?;

    let dir = tempfile::tempdir()?;
    let filled = fill(dir.path(), "sqlite").await?;
    let url = format!("secretsmanager://us-east-1?prefix=&endpoint={moto}");
    let split = format!(
        "credentials={url};rest=sqlite:{}",
        dir.path().join("rest.db").display()
    );
    let head = &foreign[..12];
    let commands: Vec<Vec<&str>> = vec![
        vec!["ls", &url, "keys"],
        vec!["show", &url, &foreign],
        vec!["stats", &url],
        vec!["check", &url],
        vec!["rm", &url, "--prefix", head, "--yes"],
        vec!["rm", &url, &foreign, "--yes"],
        vec!["gc", &url, "--yes"],
        vec!["copy", &filled.client_store, &url],
        vec!["copy", &filled.client_store, &split],
    ];
    for run in 1..=2 {
        for args in &commands {
            let out = cli(args);
            let said = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(2),
                "run {run}: {:?} was not refused as a bad store URL: {said}",
                args[0]
            );
            assert!(said.contains("empty prefix"), "{:?}: {said}", args[0]);
            assert!(
                !stdout(&out).contains(&foreign),
                "{:?} listed the other application's secret",
                args[0]
            );
            assert_eq!(
                before,
                current(&client, &foreign).await?,
                "run {run}: {:?} changed the other application's secret",
                args[0]
            );
        }
    }
    assert!(
        !dir.path().join("rest.db").exists(),
        "a refused split URL created its other store"
    );
    Ok(())
}
