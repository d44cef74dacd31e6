//! The operator's store methods, `SeaOrmLeaseStore::list` and `SeaOrmLeaseStore::revoke`, on
//! SQLite, PostgreSQL and MariaDB (both MySQL statement forms share these statements).

use crate::common;

use std::time::Duration;

use common::conformance::{Harness, LONG, PAST_SHORT, SHORT};
use common::sql::SqlHarness;
use orion_beacon::{store::LeaseOutcome, LeaseStore, StoreError};

fn token(out: &LeaseOutcome) -> i64 {
    out.token().expect("held").get()
}

pub async fn list_is_ordered_and_judged_by_the_database_clock(h: &SqlHarness) {
    let store = h.store();
    assert!(store.list().await.unwrap().is_empty());
    store.acquire_or_renew("b-res", "x", LONG).await.unwrap();
    store.acquire_or_renew("a-res", "y", LONG).await.unwrap();
    store.acquire_or_renew("c-res", "z", LONG).await.unwrap();
    assert!(store.release("c-res", "z").await.unwrap());
    store.acquire_or_renew("d-res", "w", SHORT).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;

    let all = store.list().await.unwrap();
    let names: Vec<_> = all.iter().map(|r| r.resource.as_str()).collect();
    assert_eq!(names, ["a-res", "b-res", "c-res", "d-res"]);
    let live: Vec<_> = all.iter().map(|r| r.live).collect();
    assert_eq!(live, [true, true, false, false]);
    for r in &all {
        assert_eq!(r.token.get(), 1);
        assert!(r.expires_at.is_some() && r.acquired_at.is_some() && r.renewed_at.is_some());
        if r.live {
            assert!(
                r.remaining > LONG - Duration::from_secs(10) && r.remaining <= LONG,
                "{r:?}"
            );
        } else {
            assert_eq!(r.remaining, Duration::ZERO);
        }
        // The same as `current` says, row for row (up to the time that passed between).
        let mut one = store.current(&r.resource).await.unwrap().unwrap();
        one.remaining = r.remaining;
        assert_eq!(&one, r);
    }
    assert_eq!(all[0].holder, "y");
    assert_eq!(all[2].holder, "z");
}

pub async fn revoke_tombstones_whatever_the_holder_and_keeps_the_token(h: &SqlHarness) {
    let store = h.store();
    let r = common::unique("revoke");
    assert_eq!(
        store.revoke(&r).await.unwrap(),
        None,
        "no row: nothing to do"
    );
    store.acquire_or_renew(&r, "a", LONG).await.unwrap();
    let before = store.current(&r).await.unwrap().unwrap();

    let revoked = store.revoke(&r).await.unwrap().expect("the row as it was");
    assert!(revoked.live && revoked.holder == "a" && revoked.token.get() == 1);
    assert!(revoked.remaining > LONG - Duration::from_secs(10));
    assert_eq!(revoked.acquired_at, before.acquired_at);

    // Only the expiry moved: same holder, token and term times; not live any more.
    let after = store.current(&r).await.unwrap().unwrap();
    assert!(!after.live, "{after:?}");
    assert_eq!(
        (
            &after.holder,
            after.token,
            after.acquired_at,
            after.renewed_at
        ),
        (
            &before.holder,
            before.token,
            before.acquired_at,
            before.renewed_at
        )
    );
    assert!(after.expires_at < before.expires_at);

    // Revoking again changes nothing and says it had already ended.
    let again = store.revoke(&r).await.unwrap().unwrap();
    assert!(!again.live);
    let unchanged = store.current(&r).await.unwrap().unwrap();
    assert_eq!(unchanged.expires_at, after.expires_at);

    // The next candidate takes over with a higher token.
    let b = store.acquire_or_renew(&r, "b", LONG).await.unwrap();
    assert!(matches!(b, LeaseOutcome::Acquired(_)), "{b:?}");
    assert_eq!(token(&b), 2);

    // The revoked holder's next call is not a renew: it gets a new term of its own.
    assert!(store.revoke(&r).await.unwrap().unwrap().live);
    let b_again = store.acquire_or_renew(&r, "b", LONG).await.unwrap();
    assert!(matches!(b_again, LeaseOutcome::Acquired(_)), "{b_again:?}");
    assert_eq!(token(&b_again), 3);

    assert!(matches!(
        store.revoke(" bad").await,
        Err(StoreError::InvalidResource { .. })
    ));
}

/// Revokes from another connection pool while the holder renews: every revoke of a live lease
/// starts exactly one new term, no statement fails.
pub async fn revokes_racing_renews_each_end_one_term(h: &SqlHarness) {
    let holder = h.store();
    let operator = h.separate_store().await;
    let r = common::unique("race");
    holder.acquire_or_renew(&r, "a", LONG).await.unwrap();
    let renewing = tokio::spawn({
        let holder = holder.clone();
        let r = r.clone();
        async move {
            for _ in 0..30 {
                holder.acquire_or_renew(&r, "a", LONG).await.unwrap();
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    });
    let mut live_revokes = 0;
    for _ in 0..10 {
        if operator.revoke(&r).await.unwrap().unwrap().live {
            live_revokes += 1;
        }
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    renewing.await.unwrap();
    let last = holder.acquire_or_renew(&r, "a", LONG).await.unwrap();
    assert!(live_revokes >= 1);
    assert_eq!(
        token(&last),
        1 + live_revokes,
        "one new term per live revoke"
    );
}

pub async fn missing_table_is_reported(h: &SqlHarness) {
    let store = orion_beacon::SeaOrmLeaseStore::new(h.db().clone())
        .with_table(common::unique("never_migrated"))
        .unwrap();
    for err in [
        store.list().await.unwrap_err(),
        store.revoke("r").await.unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::MissingTable { .. }), "{err:?}");
    }
}

macro_rules! admin_suite {
    ($setup:expr) => {
        admin_suite!(@cases $setup;
            list_is_ordered_and_judged_by_the_database_clock,
            revoke_tombstones_whatever_the_holder_and_keeps_the_token,
            revokes_racing_renews_each_end_one_term,
            missing_table_is_reported,
        );
    };
    (@cases $setup:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some(h) = $setup.await {
                    super::$case(&h).await;
                    h.teardown().await;
                }
            }
        )*
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    admin_suite!(SqlHarness::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    admin_suite!(SqlHarness::server(common::Server::Postgres));
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    admin_suite!(SqlHarness::server(common::Server::MySql));
}
