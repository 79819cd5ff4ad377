//! The split example runs against moto and leaves credentials in Secrets
//! Manager and everything else in SQLite.

mod common;

#[path = "../examples/split.rs"]
mod split;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_example_routes_credentials_to_secrets_manager() {
    let Some(url) = common::moto_url() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = common::unique_prefix("example");
    let report = split::run(Some(&url), &prefix, &dir.path().join("state.db"))
        .await
        .expect("the example runs");
    assert_eq!(report.in_secrets_manager.len(), 1, "{report:?}");
    assert!(mcp_persist_core::declare::CREDENTIALS.matches(&report.in_secrets_manager[0]));
    assert!(!report.in_sqlite.is_empty());
    assert!(
        report
            .in_sqlite
            .iter()
            .all(|k| mcp_persist_core::declare::of_key(k)
                .is_none_or(|d| d.role != mcp_persist_core::declare::Role::Credentials)),
        "{report:?}"
    );
}
