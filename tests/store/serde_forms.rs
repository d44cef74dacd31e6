//! With the `serde` feature, what the store and the elector report serializes for logs, APIs
//! and the command line: durations in milliseconds, times as RFC 3339, tokens as numbers.
#![cfg(feature = "serde")]

use std::time::Duration;

use orion_beacon::{
    store::Denial, store::LeaseOutcome, Elector, FencingToken, InMemoryLeaseStore, Lease,
    LeaseRecord, LeaseStore,
};
use serde_json::json;

#[test]
fn leases_denials_and_records() {
    let mut lease = Lease::new(
        "nightly",
        "node-a",
        FencingToken::new(7),
        Duration::from_millis(1500),
    );
    lease.expires_at = Some("2026-11-30T12:00:01.5Z".parse().unwrap());
    assert_eq!(
        serde_json::to_value(&lease).unwrap(),
        json!({"resource": "nightly", "holder": "node-a", "token": 7, "remaining_ms": 1500,
               "expires_at": "2026-11-30T12:00:01.500Z", "acquired_at": null, "payload": null})
    );
    assert_eq!(
        serde_json::to_value(LeaseOutcome::Renewed(lease)).unwrap()["outcome"],
        "renewed"
    );
    let mut denial = Denial::new("nightly");
    denial.holder = Some("node-b".into());
    denial.payload = Some("http://node-b:8080".into());
    assert_eq!(
        serde_json::to_value(LeaseOutcome::Denied(denial)).unwrap(),
        json!({"outcome": "denied", "resource": "nightly", "holder": "node-b", "token": null,
               "remaining_ms": 0, "expires_at": null, "payload": "http://node-b:8080"})
    );
    let record = LeaseRecord::new("nightly", "node-a", FencingToken::new(3));
    assert_eq!(serde_json::to_value(&record).unwrap()["live"], false);
    assert_eq!(serde_json::to_value(&record).unwrap()["token"], 3);
}

#[tokio::test(start_paused = true)]
async fn health() {
    let store = InMemoryLeaseStore::new();
    assert!(store.current("x").await.unwrap().is_none());
    let handle = Elector::builder(store)
        .resource("x")
        .build()
        .unwrap()
        .start();
    handle.watch().wait_for(|s| s.is_leader()).await.unwrap();
    let value = serde_json::to_value(handle.health()).unwrap();
    assert_eq!(value["healthy"], true);
    assert_eq!(value["leader"], true);
    assert_eq!(value["window_ms"], 15_000);
    assert_eq!(value["last_round_trip_ms"], 0);
    assert_eq!(value["failure"], serde_json::Value::Null);
    handle.shutdown().await;
}
