//! `Backend::fresh_postgres` on the test PostgreSQL server (`IRONFLOW_TEST_POSTGRES_URL`, set by
//! `./scripts/test`).

use ironflow_local_api::{Backend, NO_JIT};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

fn server() -> String {
    std::env::var("IRONFLOW_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "IRONFLOW_TEST_POSTGRES_URL is not set: run the tests with ./scripts/test, which \
             starts a PostgreSQL server (scripts/pg-test-server.sh)"
        )
    })
}

async fn setting(url: &str, name: &str) -> String {
    let mut conn = PgConnection::connect(url).await.expect("connects");
    let value: String = sqlx::query_scalar(&format!("SHOW {name}"))
        .fetch_one(&mut conn)
        .await
        .expect("SHOW answers");
    let _ = conn.close().await;
    value
}

#[tokio::test]
async fn a_fresh_database_runs_without_jit_whatever_the_server_s_default() {
    let server = server();
    let Backend::Postgres { url } = Backend::fresh_postgres(&server).await.expect("created") else {
        panic!("fresh_postgres gave another backend");
    };
    // The setting is the database's own (so it holds on a server whose default is `jit = on`,
    // PostgreSQL's), and a session on it gets it.
    let name = url.rsplit('/').next().expect("a database name");
    let mut conn = PgConnection::connect(&url).await.expect("connects");
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(s.setconfig) FROM pg_db_role_setting s \
         JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = $1 AND s.setrole = 0",
    )
    .bind(name)
    .fetch_all(&mut conn)
    .await
    .expect("pg_db_role_setting reads");
    let _ = conn.close().await;
    assert_eq!(NO_JIT, "jit = off");
    assert_eq!(stored, ["jit=off"], "the settings of database {name}");
    assert_eq!(setting(&url, "jit").await, "off", "{url}");
}
