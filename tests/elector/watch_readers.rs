//! A reader of `watch()` can never hold up the loop that publishes: whatever it keeps across an
//! await is a copy, so the elector and the shard-set node go on renewing, stepping down and
//! shutting down. (With tokio's own `watch::Receiver`, a `Ref` kept across an await blocked
//! the loop's next publish, and `shutdown()` hung for as long as the `Ref` lived.)

use std::time::Duration;

use orion_beacon::{Elector, InMemoryLeaseStore, Leadership, ShardSet};

/// A shutdown takes far less than this.
const BOUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_keeping_the_state_across_awaits_never_holds_up_the_elector() {
    let handle = Elector::builder(InMemoryLeaseStore::new())
        .resource("watched")
        .lease_duration(Duration::from_millis(600))
        .renew_interval(Duration::from_millis(150))
        .build()
        .unwrap()
        .start();
    let mut rx = handle.watch();
    rx.wait_for(|s| matches!(s, Leadership::Leader(_)))
        .await
        .unwrap();
    // The reader keeps what it read across every await below.
    let state = rx.borrow();
    // Renews go on meanwhile (several per lease)...
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(handle.is_leader(), "the elector kept its term");
    // ...and the shutdown publishes its states without waiting for the reader.
    tokio::time::timeout(BOUND, handle.shutdown())
        .await
        .expect("shutdown returned while a reader kept the state");
    assert!(
        matches!(state.clone(), Leadership::Leader(_)),
        "the reader's copy is the leader state it read"
    );
    drop(state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_keeping_the_assignment_across_awaits_never_holds_up_the_node() {
    let handle = ShardSet::builder(InMemoryLeaseStore::new())
        .name("watched-set")
        .resources(["a", "b", "c"])
        .member_id("n1")
        .lease_duration(Duration::from_millis(900))
        .interval(Duration::from_millis(150))
        .build()
        .unwrap()
        .start();
    let mut rx = handle.watch();
    rx.wait_for(|a| a.led.len() == 3).await.unwrap();
    let assignment = rx.borrow();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(handle.assignment().led.len(), 3, "the node kept its shards");
    tokio::time::timeout(BOUND, handle.shutdown())
        .await
        .expect("shutdown returned while a reader kept the assignment");
    assert_eq!(assignment.led.len(), 3);
    drop(assignment);
}
