-- Laravel (Eloquent; the schema builder's PostgresGrammar, as `php artisan migrate` sends it):
-- `Scan hasOne ScanReport`. `$table->id()` is a bigserial key; `$table->enum('status', [...])`
-- is a varchar(255) with a CHECK listing the values; `$table->json()` is json; `timestamps()`
-- and `softDeletes()` are timestamp(0) without time zone, nullable, written in UTC by Eloquent.
-- `foreignId('scan_id')->unique()->constrained()->cascadeOnDelete()` adds the unique constraint,
-- then the foreign key.
--
--   Schema::create('scans', function (Blueprint $table) {
--       $table->id();
--       $table->enum('status', ['queued', 'running', 'done', 'failed'])->default('queued');
--       $table->longText('document')->nullable();
--       $table->json('findings')->nullable();
--       $table->timestamps();
--       $table->softDeletes();
--   });
--   Schema::create('scan_reports', function (Blueprint $table) {
--       $table->id();
--       $table->foreignId('scan_id')->unique()->constrained()->cascadeOnDelete();
--       $table->json('findings');
--       $table->timestamps();
--   });
create table "scans" ("id" bigserial not null primary key, "status" varchar(255) check ("status" in ('queued', 'running', 'done', 'failed')) not null default 'queued', "document" text null, "findings" json null, "created_at" timestamp(0) without time zone null, "updated_at" timestamp(0) without time zone null, "deleted_at" timestamp(0) without time zone null);

create table "scan_reports" ("id" bigserial not null primary key, "scan_id" bigint not null, "findings" json not null, "created_at" timestamp(0) without time zone null, "updated_at" timestamp(0) without time zone null);
alter table "scan_reports" add constraint "scan_reports_scan_id_unique" unique ("scan_id");
alter table "scan_reports" add constraint "scan_reports_scan_id_foreign" foreign key ("scan_id") references "scans" ("id") on delete cascade;
