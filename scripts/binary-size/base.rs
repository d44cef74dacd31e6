mod note {
    use sea_orm::entity::prelude::*;
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "notes")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub body: String,
        pub at: chrono::DateTime<chrono::Utc>,
    }
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}
    impl ActiveModelBehavior for ActiveModel {}
}

/// What a small SeaORM app does: CRUD through an entity, in a transaction.
async fn base(db: &sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
    let txn = db.begin().await?;
    let row = note::ActiveModel { body: Set("hi".into()), at: Set(chrono::Utc::now()), ..Default::default() }
        .insert(&txn)
        .await?;
    let mut am: note::ActiveModel = row.into();
    am.body = Set("there".into());
    let row = am.update(&txn).await?;
    let found = note::Entity::find().filter(note::Column::Body.contains("e")).order_by_desc(note::Column::Id).all(&txn).await?;
    println!("{}", found.len());
    note::Entity::delete_by_id(row.id).exec(&txn).await?;
    txn.commit().await
}
