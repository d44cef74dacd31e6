include!("../../base.rs");
use sea_orm::ConnectionTrait;

#[tokio::main]
async fn main() {
    let url = std::env::args().nth(1).unwrap_or_default();
    let db = sea_orm::Database::connect(url).await.expect("connect");
    let r = db.execute_unprepared("SELECT 1").await;
    println!("{r:?}");
    println!("{:?}", base(&db).await);
}
