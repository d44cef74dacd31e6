//! Opening the database from a URL, with the direct connection that says why a pool could not,
//! and the URL helpers that keep a password out of every message (redact, scrub).

use std::time::Duration;

use sea_orm::DatabaseConnection;

use crate::exit::{chain, CliError};

/// Opens the database, refusing a URL whose backend this build lacks, and (SQLite) a file that
/// does not exist: a typo must not create an empty database.
pub async fn connect(url: &str, timeout: Duration) -> Result<DatabaseConnection, CliError> {
    let scheme = url.split(':').next().unwrap_or_default();
    let (backend, feature) = match scheme {
        "sqlite" => ("SQLite", "sqlite"),
        "postgres" | "postgresql" => ("PostgreSQL", "postgres"),
        "mysql" | "mariadb" => ("MySQL/MariaDB", "mysql"),
        _ => {
            return Err(CliError::BadInput(
                // Only the scheme: an unknown form (an ADO.NET string, say) may hold a password
                // anywhere.
                format!(
                    "unsupported database URL{}: use sqlite://PATH, postgres://... or \
                     mysql://...",
                    if !scheme.is_empty()
                        && scheme.len() <= 20
                        && scheme
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                    {
                        format!(" scheme {scheme:?}")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
    };
    let compiled = match feature {
        "sqlite" => cfg!(feature = "sqlite"),
        "postgres" => cfg!(feature = "postgres"),
        _ => cfg!(feature = "mysql"),
    };
    if !compiled {
        return Err(CliError::BadInput(
            format!("this build of orion-beacon has no {backend} support: rebuild orion-beacon-cli with `--features {feature}`"),
        ));
    }
    let url = &driver_url(url);
    let mut options = if scheme == "sqlite" {
        sqlite_options(url)?
    } else {
        sea_orm::ConnectOptions::new(url)
    };
    options
        .max_connections(2)
        .min_connections(0)
        .connect_timeout(timeout)
        .acquire_timeout(timeout)
        .sqlx_logging(false);
    match sea_orm::Database::connect(options).await {
        Ok(db) => Ok(db),
        Err(err) => {
            // A pool only says it timed out; one direct connection says why.
            let cause = match direct_error(url, timeout).await {
                Some(cause) => cause,
                None => chain(&err),
            };
            let cause = scrub(&cause, url);
            Err(CliError::Unreachable(format!(
                "cannot reach the database at {}: {cause} (is the server up and reachable, \
                     and are the host, port, database name and credentials right?)",
                redact(url),
            )))
        }
    }
}

/// The error of one direct connection to `url`, without a pool in between (which reports any
/// failure to connect as a time-out).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn direct_error(url: &str, timeout: Duration) -> Option<String> {
    use sea_orm::sqlx::Connection as _;
    let scheme = url.split(':').next().unwrap_or_default();
    let attempt = async {
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => sea_orm::sqlx::PgConnection::connect(url)
                .await
                .err()
                .map(|e| database_message(&e)),
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => sea_orm::sqlx::MySqlConnection::connect(url)
                .await
                .err()
                .map(|e| database_message(&e)),
            _ => None,
        }
    };
    tokio::time::timeout(timeout, attempt).await.ok().flatten()
}

#[cfg(not(any(feature = "postgres", feature = "mysql")))]
async fn direct_error(_url: &str, _timeout: Duration) -> Option<String> {
    None
}

/// A sqlx error as one line: the server's own message where there is one (without the source
/// file and line sqlx's debug form adds), else the error's text.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn database_message(err: &sea_orm::sqlx::Error) -> String {
    match err.as_database_error() {
        Some(db) => db.message().to_owned(),
        None => err.to_string(),
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_options(url: &str) -> Result<sea_orm::ConnectOptions, CliError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or_default();
    let path = rest.split('?').next().unwrap_or_default();
    if !path.is_empty() && path != ":memory:" && !std::path::Path::new(path).exists() {
        return Err(CliError::Unreachable(format!(
            "cannot reach the database at {}: no SQLite database file at {path}",
            redact(url)
        )));
    }
    Ok(orion_beacon::backend::sqlite::connect_options(url))
}

#[cfg(not(feature = "sqlite"))]
fn sqlite_options(_url: &str) -> Result<sea_orm::ConnectOptions, CliError> {
    Err(CliError::BadInput(
        "this build of orion-beacon has no SQLite support: rebuild orion-beacon-cli with `--features sqlite`"
            .to_owned(),
    ))
}

/// `url` as sqlx and sea-orm take it: they know MariaDB only as `mysql://`.
pub fn driver_url(url: &str) -> String {
    match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    }
}

/// The URL with its password, if any, replaced by `***`: in the user part (also when the
/// password has characters a URL parser refuses, like an unencoded `#` or `/`) and in a
/// `password=` query parameter.
pub fn redact(text: &str) -> String {
    match parsed_url(text) {
        Some(mut parsed) => {
            if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
                return "<a database URL>".to_owned();
            }
            // Query keys as the driver reads them (percent-decoded, any case).
            let pairs: Vec<(String, String)> = parsed
                .query_pairs()
                .map(|(k, v)| {
                    let v = if is_password_key(&k) {
                        "***".to_owned()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            parsed.to_string()
        }
        // Not a URL a parser accepts (an unencoded `#` or `/` in the password, say): mask by
        // hand.
        None => mask_password_parameter(&mask_userinfo(text)),
    }
}

/// `text` as a URL, where it reads as one. Database URLs have no fragment: a `#` means an
/// unencoded `#` in the password, which a URL parser takes for the start of one.
fn parsed_url(text: &str) -> Option<url::Url> {
    url::Url::parse(text)
        .ok()
        .filter(|u| u.fragment().is_none())
}

/// Whether a query parameter carries a password (as sqlx reads them: any case).
fn is_password_key(key: &str) -> bool {
    matches!(key.to_ascii_lowercase().as_str(), "password" | "pwd")
}

/// `(scheme, user, password, rest after the @)` of `scheme://user:password@rest`, taking the
/// last `@` as the end of the user part (for text no URL parser accepts).
fn userinfo(text: &str) -> Option<(&str, &str, &str, &str)> {
    let (scheme, rest) = text.split_once("://")?;
    let at = rest.rfind('@')?;
    let (user, password) = rest[..at].split_once(':')?;
    Some((scheme, user, password, &rest[at + 1..]))
}

/// `scheme://user:***@rest`.
fn mask_userinfo(text: &str) -> String {
    match userinfo(text) {
        Some((scheme, user, _password, rest)) => format!("{scheme}://{user}:***@{rest}"),
        None => text.to_owned(),
    }
}

/// Every `password=...` (or `pwd=`) value, any case, up to the next `&` or `;`, as `***`.
fn mask_password_parameter(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = ["password=", "pwd="]
        .iter()
        .filter_map(|key| lower[at..].find(key).map(|i| (at + i, key.len())))
        .min()
    {
        let value = found.0 + found.1;
        out.push_str(&text[at..value]);
        out.push_str("***");
        let end = text[value..]
            .find(['&', ';'])
            .map_or(text.len(), |i| value + i);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// `text` (an error's words, which may quote the URL) with the URL and its password taken out.
/// A password is replaced on its own only when it is long enough not to be an ordinary word of
/// the message (a user name, a port).
pub fn scrub(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact(url));
    for password in passwords(url) {
        if password.chars().count() >= 6 {
            text = text.replace(&password, "***");
        }
    }
    text
}

/// The passwords in `url`: the user part's (within the authority) and any password parameter.
fn passwords(url: &str) -> Vec<String> {
    match parsed_url(url) {
        Some(parsed) => parsed
            .password()
            .map(str::to_owned)
            .into_iter()
            .chain(
                parsed
                    .query_pairs()
                    .filter(|(k, _)| is_password_key(k))
                    .map(|(_, v)| v.into_owned()),
            )
            .collect(),
        None => userinfo(url)
            .map(|(_, _, password, _)| vec![password.to_owned()])
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redact("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(redact("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(
            redact("mysql://root:p@ss@host/x"),
            "mysql://root:***@host/x"
        );
        // Characters a URL parser refuses or reads otherwise, unencoded in the password.
        for (url, shown) in [
            ("postgres://app:p#ss@db/app", "postgres://app:***@db/app"),
            ("postgres://app:123#x@db/app", "postgres://app:***@db/app"),
            ("postgres://app:a/b?c@db/app", "postgres://app:***@db/app"),
            (
                "postgres://app@db/app?password=s3cret&sslmode=require",
                "postgres://app@db/app?password=***&sslmode=require",
            ),
            (
                "postgres://app@db/app?pass%77ord=hunter2",
                "postgres://app@db/app?password=***",
            ),
            (
                "postgres://app@db/app?PASSWORD=hunter2",
                "postgres://app@db/app?PASSWORD=***",
            ),
            (
                "postgres://db:5432/app?application_name=a@b",
                "postgres://db:5432/app?application_name=a%40b",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
        // Error texts quoting the URL or the password lose both.
        let url = "mysql://root:hunter2@db/x";
        let said = scrub(
            &format!("connection string '{url}' has no driver; hunter2"),
            url,
        );
        assert!(!said.contains("hunter2"), "{said}");
    }
}
