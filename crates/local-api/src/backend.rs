//! Where the embedded API keeps its runs: ironflow-store's in-memory store, or its PostgreSQL
//! store (`store-postgres`: sqlx, the migrations embedded and applied at connection), as an
//! operator's API server does.

use std::sync::Arc;

use ironflow_store::memory::InMemoryStore;
use ironflow_store::postgres::PostgresStore;
use ironflow_store::store::Store;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::LocalApiError;

/// The setting every [`Backend::fresh_postgres`] database gets: no JIT compilation of queries.
pub const NO_JIT: &str = "jit = off";

/// The embedded API's store.
#[derive(Debug, Clone, Default)]
pub enum Backend {
    /// ironflow-store's in-memory store, fresh at each start.
    #[default]
    Memory,
    /// ironflow-store's PostgreSQL store on the database at `url`
    /// (`postgres://user:password@host:port/database`); its migrations run at start.
    Postgres {
        /// The database's URL.
        url: String,
    },
}

impl Backend {
    /// A new, empty database on the PostgreSQL server at `server_url` (a URL without a
    /// database, or with one to connect to for the `CREATE DATABASE`, e.g.
    /// `postgres://postgres@127.0.0.1:5432`): each test gets one of its own, since
    /// ironflow-store's migrations create named schemas (`lib_fsm`) that a schema per test
    /// could not separate.
    ///
    /// The database runs with [`NO_JIT`] (`jit = off`): PostgreSQL would otherwise compile the
    /// API's claim query with LLVM at every call whenever the planner's estimate of its cost
    /// passes `jit_above_cost`, which on a young, growing database depends on when autovacuum
    /// last analyzed it. Measured on the fleet benchmark: 70 to 170 ms of compilation for a
    /// query that runs in about 3 ms (docs/benchmark.md, "PostgreSQL's JIT").
    ///
    /// # Errors
    ///
    /// [`LocalApiError::Database`] when the server cannot be reached or refuses.
    pub async fn fresh_postgres(server_url: &str) -> Result<Self, LocalApiError> {
        let (server, _) = split_database(server_url);
        let admin = format!("{server}/postgres");
        let failed = |reason: String| LocalApiError::Database {
            url: masked_url(&admin),
            reason,
        };
        let mut conn = PgConnection::connect(&admin)
            .await
            .map_err(|e| failed(format!("could not connect: {e}")))?;
        let name = format!("ironflow_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .map_err(|e| failed(format!("CREATE DATABASE {name} failed: {e}")))?;
        sqlx::query(&format!("ALTER DATABASE \"{name}\" SET {NO_JIT}"))
            .execute(&mut conn)
            .await
            .map_err(|e| failed(format!("ALTER DATABASE {name} SET {NO_JIT} failed: {e}")))?;
        let _ = conn.close().await;
        Ok(Self::Postgres {
            url: format!("{server}/{name}"),
        })
    }

    /// What it is, for a report or a log line: `in-memory` or the URL with its password
    /// masked.
    pub fn describe(&self) -> String {
        match self {
            Self::Memory => "in-memory store".to_string(),
            Self::Postgres { url } => format!("PostgreSQL at {}", masked_url(url)),
        }
    }

    /// The store, connected (and migrated) for PostgreSQL.
    pub(crate) async fn store(&self) -> Result<Arc<dyn Store>, LocalApiError> {
        match self {
            Self::Memory => Ok(Arc::new(InMemoryStore::new())),
            Self::Postgres { url } => {
                probe(url).await?;
                let store = PostgresStore::new(url)
                    .await
                    .map_err(|e| LocalApiError::Database {
                        url: masked_url(url),
                        reason: e.to_string(),
                    })?;
                Ok(Arc::new(store))
            }
        }
    }
}

/// How long the first connection to a PostgreSQL server may take: 10 s.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One connection to `url`, closed at once: the reason it fails (refused, unknown host, wrong
/// password, no such database), which the store's pool reports only as a timeout.
async fn probe(url: &str) -> Result<(), LocalApiError> {
    let failed = |reason: String| LocalApiError::Database {
        url: masked_url(url),
        reason,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(failed(format!("could not connect: {e}"))),
        Err(_) => Err(failed(format!(
            "no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// `postgres://user:pw@host:port/db?x` → (`postgres://user:pw@host:port`, `Some("db?x")`).
fn split_database(url: &str) -> (&str, Option<&str>) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(slash) => {
            let at = after_scheme + slash;
            (&url[..at], Some(&url[at + 1..]))
        }
        None => (url.trim_end_matches('/'), None),
    }
}

/// `url` with the password of its `user:password@` part replaced by `****`, for errors and
/// logs: `postgres://app:s3cr3t@db:5432/runs` → `postgres://app:****@db:5432/runs`.
pub fn masked_url(url: &str) -> String {
    mask_key_value_password(&mask_query_password(&mask_userinfo(url)))
}

/// `…?sslmode=require&password=s3cr3t` → `…?sslmode=require&password=****`.
fn mask_query_password(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=****"),
            _ => p.to_string(),
        })
        .collect();
    format!("{head}?{}", params.join("&"))
}

fn mask_userinfo(url: &str) -> String {
    // From the scheme to the last `@` of the whole string: a password may hold `/`, `?`, `#`
    // or `@` (masking too much is safe, leaking is not).
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let Some(at) = url[after_scheme..].rfind('@').map(|i| after_scheme + i) else {
        return url.to_string();
    };
    let userinfo = &url[after_scheme..at];
    let Some(colon) = userinfo.find(':') else {
        return url.to_string();
    };
    format!(
        "{}{}:****{}",
        &url[..after_scheme],
        &userinfo[..colon],
        &url[at..]
    )
}

/// `host=db user=app password=s3cr3t` (libpq's key/value form) → `… password=****`.
fn mask_key_value_password(text: &str) -> String {
    text.split(' ')
        .map(|word| match word.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=****"),
            _ => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_nothing_else_changes() {
        assert_eq!(
            masked_url("postgres://app:s3cr3t@db:5432/runs"),
            "postgres://app:****@db:5432/runs"
        );
        assert_eq!(
            masked_url("postgres://app:p@ss:w@rd@db/runs?sslmode=require"),
            "postgres://app:****@db/runs?sslmode=require"
        );
        assert_eq!(
            masked_url("postgres://app@db/runs"),
            "postgres://app@db/runs"
        );
        assert_eq!(masked_url("postgres://db/runs"), "postgres://db/runs");
        assert_eq!(
            masked_url("postgres://db/runs?user=app&Password=s3cr3t&sslmode=require"),
            "postgres://db/runs?user=app&Password=****&sslmode=require"
        );
        for url in [
            "postgres://u:sec#ret@127.0.0.1:1/d",
            "postgres://u:sec/ret@127.0.0.1:1/d",
            "postgres://u:sec?ret@127.0.0.1:1/d",
            "postgres://u:s@c@127.0.0.1:1/d",
        ] {
            assert_eq!(masked_url(url), "postgres://u:****@127.0.0.1:1/d", "{url}");
        }
        assert_eq!(
            masked_url("host=127.0.0.1 port=1 user=postgres password=secret7 dbname=t1"),
            "host=127.0.0.1 port=1 user=postgres password=**** dbname=t1"
        );
        assert_eq!(masked_url("not a url"), "not a url");
    }

    #[test]
    fn the_database_is_split_off_the_server() {
        assert_eq!(
            split_database("postgres://p@127.0.0.1:5432"),
            ("postgres://p@127.0.0.1:5432", None)
        );
        assert_eq!(
            split_database("postgres://p@127.0.0.1:5432/"),
            ("postgres://p@127.0.0.1:5432", Some(""))
        );
        assert_eq!(
            split_database("postgres://p@h/db"),
            ("postgres://p@h", Some("db"))
        );
    }
}
