-- Kysely (its schema builder in a migration; Kysely makes no schema from types): `task` and
-- `task_result`, the result's task_id unique and referencing the task, deleted with it. The
-- status column is `state`, a varchar with a CHECK; verdicts in jsonb; timestamps with time zone
-- defaulting to now(), which the app moves itself on update.
--
--   await db.schema.createTable("task")
--     .addColumn("id", "uuid", (col) => col.primaryKey().defaultTo(sql`gen_random_uuid()`))
--     .addColumn("state", "varchar(16)", (col) =>
--       col.notNull().defaultTo("queued")
--          .check(sql`state in ('queued', 'running', 'complete', 'failed')`))
--     .addColumn("body", "text")
--     .addColumn("verdict", "jsonb")
--     .addColumn("created_at", "timestamptz", (col) => col.notNull().defaultTo(sql`now()`))
--     .addColumn("updated_at", "timestamptz", (col) => col.notNull().defaultTo(sql`now()`))
--     .execute();
--   await db.schema.createTable("task_result")
--     .addColumn("id", "serial", (col) => col.primaryKey())
--     .addColumn("task_id", "uuid", (col) =>
--       col.notNull().unique().references("task.id").onDelete("cascade"))
--     .addColumn("verdict", "jsonb", (col) => col.notNull())
--     .addColumn("created_at", "timestamptz", (col) => col.notNull().defaultTo(sql`now()`))
--     .execute();
create table "task" ("id" uuid default gen_random_uuid() primary key, "state" varchar(16) default 'queued' not null check (state in ('queued', 'running', 'complete', 'failed')), "body" text, "verdict" jsonb, "created_at" timestamptz default now() not null, "updated_at" timestamptz default now() not null);

create table "task_result" ("id" serial primary key, "task_id" uuid not null unique references "task" ("id") on delete cascade, "verdict" jsonb not null, "created_at" timestamptz default now() not null);
