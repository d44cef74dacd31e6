use super::*;

#[tokio::test]
async fn a_store_derived_by_a_builder_shares_what_the_first_one_looked_at() {
    let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
    let store = SeaOrmLeaseStore::new(db);
    let derived = store
        .clone()
        .with_member_table("other_members")
        .unwrap()
        .with_release_notifications(false)
        .with_table("other_leases")
        .unwrap();
    let (a, b) = (store.engine().unwrap(), derived.engine().unwrap());
    assert!(Arc::ptr_eq(
        &a.cx.durability_checked,
        &b.cx.durability_checked
    ));
    assert!(Arc::ptr_eq(&a.takeovers, &b.takeovers));
    // The statements are rendered for the new table.
    assert_eq!(b.cx.table(), "other_leases");
    assert_eq!(&*b.cx.member_table, "other_members");
    assert!(b.cx.prepared.acquire.get().is_none());
    // A store on another connection shares nothing.
    let other = SeaOrmLeaseStore::new(sea_orm::Database::connect("sqlite::memory:").await.unwrap());
    assert!(!Arc::ptr_eq(
        &a.takeovers,
        &other.engine().unwrap().takeovers
    ));
}
