include!("../../base.rs");
use std::time::Duration;

use orion_beacon::jobs::{Job, Jobs, Schedule};
use orion_beacon::{Elector, Locks, SeaOrmLeaseStore};
use sea_orm::ConnectionTrait;

#[tokio::main]
async fn main() {
    let url = std::env::args().nth(1).unwrap_or_default();
    let db = sea_orm::Database::connect(url).await.expect("connect");
    let r = db.execute_unprepared("SELECT 1").await;
    println!("{r:?}");
    println!("{:?}", base(&db).await);
    let store = SeaOrmLeaseStore::new(db.clone());
    let handle = Elector::builder(store.clone()).resource("r").build().expect("elector").start();
    let locks = Locks::new(store.clone()).expect("locks");
    let guard = locks.lock("x").expect("lock").acquire(Duration::from_secs(1)).await;
    println!("{}", guard.is_ok());
    let job = Job::new("j", Schedule::cron("0 2 * * *", "Europe/Berlin").expect("cron"), |_run| async { Ok(()) });
    let jobs = Jobs::builder(store).job(job).build().expect("jobs").start();
    jobs.shutdown().await;
    handle.shutdown().await;
}
